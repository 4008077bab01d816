/**
 * Spans under the OpenTelemetry GenAI conventions, when the application uses OpenTelemetry.
 *
 * `@opentelemetry/api` is an optional peer dependency: when the application has it (and
 * registered a tracer provider), each delivery is an `invoke_agent {capability}` server span
 * continuing the router's `traceparent`, with `gen_ai.operation.name`, `gen_ai.agent.name`,
 * `gen_ai.agent.id`, `gen_ai.conversation.id` and the usage the handler reported
 * (`gen_ai.usage.input_tokens`/`output_tokens`, `gen_ai.request.model`) beside our own
 * `capability`, `request_id` and `agent_id`; calls onwards name it as their parent. Without
 * the package nothing is loaded and a delivery pays one check.
 */

import type { Span, Tracer } from "@opentelemetry/api";

import type { Usage } from "./wire.js";

/** `gen_ai.provider.name` of the SDK's spans, as of the router's. */
export const GEN_AI_PROVIDER = "agent_reach";

type Api = typeof import("@opentelemetry/api");

let api: Api | undefined;
let tracer: Tracer | undefined;

/** Loads `@opentelemetry/api` once, if the application installed it. */
export async function loadTelemetry(): Promise<void> {
  if (api !== undefined) return;
  try {
    api = await import("@opentelemetry/api");
  } catch {
    api = undefined;
  }
}

/** What a delivery's span needs to know about it. */
export interface Traced {
  capability: string;
  requestId: string;
  sessionId: string | undefined;
  traceparent: string | undefined;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * Whether the application registered a tracer provider (the API's global one delegates to
 * a no-op until it does): checked per delivery, so one registered late is still used, and
 * an application that installed the API without a provider builds no span at all.
 */
function recording(otel: Api): boolean {
  const provider = otel.trace.getTracerProvider() as { getDelegate?: () => object };
  const delegate = provider.getDelegate?.() ?? provider;
  return delegate.constructor.name !== "NoopTracerProvider";
}

/** A delivery's span: started, or undefined when spans are off (no package, no provider). */
export function startDelivery(delivery: Traced, agentId: string): DeliverySpan | undefined {
  if (api === undefined || !recording(api)) return undefined;
  tracer ??= api.trace.getTracer("agent_reach");
  let parent = api.ROOT_CONTEXT;
  const [, traceId, spanId, flags] = (delivery.traceparent === undefined ? null : TRACEPARENT.exec(delivery.traceparent)) ?? [];
  if (traceId !== undefined && spanId !== undefined && flags !== undefined) {
    parent = api.trace.setSpanContext(parent, { traceId, spanId, traceFlags: Number.parseInt(flags, 16), isRemote: true });
  }
  const attributes: Record<string, string> = {
    "gen_ai.operation.name": "invoke_agent",
    "gen_ai.provider.name": GEN_AI_PROVIDER,
    "gen_ai.agent.name": delivery.capability,
    "gen_ai.agent.id": agentId,
    capability: delivery.capability,
    request_id: delivery.requestId,
    agent_id: agentId,
  };
  if (delivery.sessionId !== undefined) attributes["gen_ai.conversation.id"] = delivery.sessionId;
  const span = tracer.startSpan(`invoke_agent ${delivery.capability}`, { kind: api.SpanKind.SERVER, attributes }, parent);
  if (!span.isRecording()) return undefined;
  return new DeliverySpan(api, span);
}

export class DeliverySpan {
  readonly #api: Api;
  readonly #span: Span;

  constructor(otel: Api, span: Span) {
    this.#api = otel;
    this.#span = span;
  }

  /** The `traceparent` naming this span as the parent of a call onwards. */
  get traceparent(): string {
    const context = this.#span.spanContext();
    return `00-${context.traceId}-${context.spanId}-${context.traceFlags.toString(16).padStart(2, "0")}`;
  }

  /** Ends the span with the answer's status, error code and the handler's usage. */
  end(status: number, code: string, usage: Usage | undefined): void {
    const span = this.#span;
    span.setAttribute("http.response.status_code", status);
    if (usage?.input_tokens !== undefined) span.setAttribute("gen_ai.usage.input_tokens", usage.input_tokens);
    if (usage?.output_tokens !== undefined) span.setAttribute("gen_ai.usage.output_tokens", usage.output_tokens);
    if (usage?.model !== undefined) span.setAttribute("gen_ai.request.model", usage.model);
    if (status >= 400) {
      span.setAttribute("error.type", code);
      span.setStatus({ code: this.#api.SpanStatusCode.ERROR, message: code });
    }
    span.end();
  }
}
