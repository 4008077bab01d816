/**
 * What a handler knows about the delivery it serves, and how it reaches the rest: the
 * verified caller, the deadline, the session and its context, calls onwards through the
 * router (carrying this request's deadline, session, context, priority and trace), and
 * the 202 flow for work that outlives the delivery.
 */

import type { z } from "zod";

import { ContextHandle, type Contexts } from "./contexts.js";
import { Accepted, HandlerError, RouterError, TransportError } from "./errors.js";
import { log } from "./log.js";
import { CallStream } from "./sse.js";
import {
  childTraceparent,
  invokeBody,
  invokeResult,
  jsonHeaders,
  listCapabilities,
  nowMs,
  send,
  type CallOptions,
  type CapabilityOffer,
  type InvokeResult,
  type Priority,
  type Usage,
} from "./wire.js";

/** The links every delivery of one agent shares. */
export interface Links {
  router: string | undefined;
  contexts: Contexts | undefined;
  token: string;
  /** Work accepted with `acceptAndReport` and still running (a drain waits for it). */
  background: Set<Promise<void>>;
}

/** Options of a call from a handler: as a client's, less the ids this request fixes. */
export type CtxCallOptions = Omit<CallOptions, "sessionId" | "contextId" | "requestId">;

export interface Delivery {
  requestId: string;
  sessionId: string | undefined;
  contextId: string | undefined;
  source: string | undefined;
  tenant: string | undefined;
  capability: string;
  capabilityVersion: string;
  deadlineMs: number;
  attempt: number;
  priority: Priority;
  traceparent: string | undefined;
  taskId: string | undefined;
  /** The checkpoint a resumed delivery carries (DESIGN §9). */
  checkpoint?: unknown;
  /** Set on a preemptible handler's task delivery: `requested` once the router asks it to pause. */
  pause?: { requested: boolean };
  /** The router's assertion for this delivery (calls onwards present it upstream). */
  assertionToken?: string | undefined;
  /** The delegation chain the assertion vouches for. */
  chain?: readonly string[] | undefined;
  /** What is left of the chain's budget, this call charged. */
  budget?: Budget | undefined;
  history: readonly Turn[];
}

/** What is left of a delegation chain's budget (DESIGN §9); a member is absent when the budget set no limit of that kind. */
export interface Budget {
  callsLeft?: number;
  costLeft?: number;
}

/**
 * One earlier turn of a multi-turn task's conversation (docs/design.md, "Multi-turn
 * tasks"), as the router delivers it with the next message: a message of the caller (its
 * `payload`) or a time this agent asked for more input (its `message`; see `InputRequired`).
 */
export type Turn = { readonly role: "user"; readonly payload: unknown } | { readonly role: "agent"; readonly message: string };

/** The envelope's `history` as turns; one this SDK cannot read is left out. */
export function turnsOf(history: unknown): readonly Turn[] {
  if (!Array.isArray(history)) return [];
  const turns: Turn[] = [];
  for (const turn of history as unknown[]) {
    if (typeof turn !== "object" || turn === null) return [];
    const { role, payload, message } = turn as { role?: unknown; payload?: unknown; message?: unknown };
    if (role === "user") turns.push({ role, payload: payload ?? null });
    else if (role === "agent" && typeof message === "string") turns.push({ role, message });
    else return [];
  }
  return turns;
}

export class Ctx {
  /** The idempotency key of this request. */
  readonly requestId: string;
  readonly sessionId: string | undefined;
  readonly contextId: string | undefined;
  /** The verified caller (the assertion's `sub`). */
  readonly source: string | undefined;
  /** The tenant the router's assertion names (undefined when unverified). */
  readonly tenant: string | undefined;
  readonly capability: string;
  readonly capabilityVersion: string;
  /** Absolute deadline, epoch milliseconds. */
  readonly deadlineMs: number;
  /** 1 for the first delivery, 2 for the first retry, ... */
  readonly attempt: number;
  readonly priority: Priority;
  readonly traceparent: string | undefined;
  /** Set on a task's delivery (`POST /v1/tasks`). */
  readonly taskId: string | undefined;
  /** The checkpoint this delivery resumes from (what the handler threw `Paused` with); undefined for a first delivery. */
  readonly checkpoint: unknown;
  readonly #pause: { requested: boolean } | undefined;
  /**
   * The delegation chain the router vouches for (DESIGN §9): the original subject first, each
   * agent it passed through, the immediate caller last. Empty without an assertion (insecure mode).
   */
  readonly chain: readonly string[];
  /** What is left of the chain's budget (this call charged), when the call carries one. */
  readonly budget: Budget | undefined;
  readonly #upstream: string | undefined;
  /**
   * A multi-turn task's conversation before this message, oldest first: the caller's
   * earlier messages and what this agent asked (empty for a first message).
   */
  readonly history: readonly Turn[];
  readonly #signal: { readonly signal: AbortSignal };
  readonly #links: Links;
  /** The `traceparent` of this delivery's own span, when OpenTelemetry records one: calls onwards are its children. */
  readonly #span: string | undefined;
  #usage: Usage | undefined;

  /** `signal` is read only when a handler asks for it (an AbortController per delivery costs). */
  constructor(delivery: Delivery, links: Links, signal: { readonly signal: AbortSignal }, span?: string) {
    this.requestId = delivery.requestId;
    this.sessionId = delivery.sessionId;
    this.contextId = delivery.contextId;
    this.source = delivery.source;
    this.tenant = delivery.tenant;
    this.capability = delivery.capability;
    this.capabilityVersion = delivery.capabilityVersion;
    this.deadlineMs = delivery.deadlineMs;
    this.attempt = delivery.attempt;
    this.priority = delivery.priority;
    this.traceparent = delivery.traceparent;
    this.taskId = delivery.taskId;
    this.checkpoint = delivery.checkpoint ?? undefined;
    this.#pause = delivery.pause;
    this.chain = delivery.chain ?? [];
    this.budget = delivery.budget;
    this.#upstream = delivery.assertionToken;
    this.history = delivery.history;
    this.#signal = signal;
    this.#links = links;
    this.#span = span;
  }

  /** On whose behalf this call is made: the chain's original subject (the caller itself for a direct call). */
  get onBehalfOf(): string | undefined {
    return this.chain[0];
  }

  /**
   * Whether the router asked this delivery to pause (DESIGN §9): higher-priority work waits
   * for this agent's room. A `preemptible` handler looks at it at its checkpoints and, when
   * asked, throws `new Paused(checkpoint)`. Always false for a handler not declared
   * preemptible and for a call that is not a task's delivery.
   */
  get pauseRequested(): boolean {
    return this.#pause?.requested === true;
  }

  /**
   * Reports what serving this call cost (DESIGN §3.5 `usage`): model tokens, the model, and
   * `cost` in the abstract unit a delegation budget counts (default: the tokens' sum). Sent
   * beside the output, it appears on the router's and this agent's `invoke_agent` spans
   * (`gen_ai.usage.input_tokens`/`output_tokens`, `gen_ai.request.model`) and in the router's
   * `agent_reach_model_tokens_total`. Several reports add up (the later model wins). Not
   * sent with a streamed answer.
   */
  reportUsage(usage: { inputTokens?: number; outputTokens?: number; model?: string; cost?: number }): void {
    for (const [name, value] of [["inputTokens", usage.inputTokens], ["outputTokens", usage.outputTokens]] as const) {
      if (value !== undefined && !(Number.isSafeInteger(value) && value >= 0)) {
        throw new TypeError(`reportUsage: ${name} must be a non-negative integer, not ${String(value)}`);
      }
    }
    const total: Usage = this.#usage ?? { cost: 0 };
    total.cost += usage.cost ?? (usage.inputTokens ?? 0) + (usage.outputTokens ?? 0);
    if (usage.inputTokens !== undefined) total.input_tokens = (total.input_tokens ?? 0) + usage.inputTokens;
    if (usage.outputTokens !== undefined) total.output_tokens = (total.output_tokens ?? 0) + usage.outputTokens;
    if (usage.model !== undefined) total.model = usage.model;
    this.#usage = total;
  }

  /** What `reportUsage` reported so far (`{cost, input_tokens?, output_tokens?, model?}`). */
  get usage(): Usage | undefined {
    return this.#usage === undefined ? undefined : { ...this.#usage };
  }

  /** Aborted when the deadline passes or the caller goes away: pass it to your own I/O. */
  get signal(): AbortSignal {
    return this.#signal.signal;
  }

  /** Milliseconds left before the deadline (0 once it passed). */
  get remainingMs(): number {
    return Math.max(0, this.deadlineMs - nowMs());
  }

  /** The session context this request names (`context_id`). */
  get context(): ContextHandle {
    return new ContextHandle(this.#links.contexts, this.contextId);
  }

  #request(capability: string, payload: unknown, options: CtxCallOptions, accept: string) {
    const router = this.#links.router;
    if (router === undefined) throw new TransportError("NO_ROUTER", "this agent was built without a router URL (`router`)");
    let deadlineMs = this.deadlineMs;
    if (options.timeoutMs !== undefined) deadlineMs = Math.min(deadlineMs, nowMs() + options.timeoutMs);
    const body = invokeBody(capability, payload, {
      ...options,
      priority: options.priority ?? this.priority,
      deadlineMs,
      ...(this.sessionId === undefined ? {} : { sessionId: this.sessionId }),
      ...(this.contextId === undefined ? {} : { contextId: this.contextId }),
    });
    const traceparent = this.#span ?? childTraceparent(this.traceparent);
    // The router carries this call's delegation chain (and budget) on from the upstream assertion.
    const upstream =
      this.#upstream === undefined ? {} : { "agent-reach-upstream": this.#upstream, "agent-reach-upstream-request": this.requestId };
    const headers = jsonHeaders(this.#links.token, { traceparent, accept, ...upstream });
    return { url: `${router.replace(/\/+$/, "")}/v1/invoke`, body, headers, deadlineMs };
  }

  /** The capabilities this agent may call under the router's `acl.yaml` (e.g. to offer them as a model's tools). */
  async capabilities(): Promise<CapabilityOffer[]> {
    const router = this.#links.router;
    if (router === undefined) throw new TransportError("NO_ROUTER", "this agent was built without a router URL (`router`)");
    return listCapabilities(router, this.#links.token);
  }

  /**
   * Calls `capability` through the router and returns its output, validated by `output`
   * when given. A failure throws the router's typed error; left uncaught in a handler it
   * becomes the handler's error with the same code (503 when retryable, else 502).
   */
  async call<S extends z.ZodType>(
    capability: string,
    payload: unknown,
    options: CtxCallOptions & { output: S },
  ): Promise<z.output<S>>;
  async call(capability: string, payload: unknown, options?: CtxCallOptions): Promise<unknown>;
  async call(capability: string, payload: unknown, options: CtxCallOptions & { output?: z.ZodType } = {}): Promise<unknown> {
    const { output, ...rest } = options;
    const result = await this.callEnvelope(capability, payload, rest);
    if (output === undefined) return result.output;
    const parsed = output.safeParse(result.output);
    if (!parsed.success) {
      throw new RouterError("OUTPUT_MISMATCH", `\`${capability}\` answered a shape its output type refuses: ${parsed.error.message}`);
    }
    return parsed.data;
  }

  /** Like {@link Ctx.call}, with the whole result envelope (agent, attempts, latency). */
  async callEnvelope(capability: string, payload: unknown, options: CtxCallOptions = {}): Promise<InvokeResult> {
    const { url, body, headers, deadlineMs } = this.#request(capability, payload, options, "application/json");
    // The router answers by the deadline; the slack lets its DEADLINE_EXCEEDED arrive.
    const response = await send("router", url, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      timeoutMs: Math.max(0, deadlineMs - nowMs()) + 2000,
    });
    return invokeResult(response);
  }

  /**
   * Calls `capability` as a stream (`Accept: text/event-stream`): iterate the result for
   * the agent's items as they arrive; `stream.result` is the router's closing result.
   */
  stream<T = unknown>(capability: string, payload: unknown, options: CtxCallOptions = {}): CallStream<T> {
    const { url, body, headers, deadlineMs } = this.#request(capability, payload, options, "text/event-stream");
    const abort = new AbortController();
    const bound = AbortSignal.any([abort.signal, AbortSignal.timeout(Math.max(1, deadlineMs - nowMs() + 2000)), this.signal]);
    const response = send("router", url, { method: "POST", headers, body: JSON.stringify(body), signal: bound });
    return new CallStream<T>(response, abort);
  }

  /**
   * Long work on a task's delivery: answers `202 Accepted` at once (the router releases
   * the connection), runs `work` in the background and reports its outcome with
   * `POST /v1/tasks/{task_id}/result` (DESIGN §3.10.5), retried while the router is
   * unreachable, until the deadline. On a synchronous call (no `taskId`) the work simply
   * runs and answers. Return (or await) it as the handler's answer.
   */
  async acceptAndReport<O>(work: () => Promise<O>): Promise<O> {
    const router = this.#links.router;
    if (this.taskId === undefined || router === undefined) return work();
    const url = `${router.replace(/\/+$/, "")}/v1/tasks/${encodeURIComponent(this.taskId)}/result`;
    const token = this.#links.token;
    const deadlineMs = this.deadlineMs;
    const background = this.#links.background;
    const job = (async () => {
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<typeof LATE>((resolve) => (timer = setTimeout(() => { resolve(LATE); }, Math.max(0, deadlineMs - nowMs()))));
      let body: unknown;
      try {
        const outcome = await Promise.race([work(), late]);
        // Past the deadline nothing is reported: the router fails the task at this same deadline.
        if (outcome === LATE) return;
        body = { output: outcome ?? null };
      } catch (error) {
        body =
          error instanceof HandlerError
            ? { error: { code: error.code, message: error.message } }
            : { error: { code: "HANDLER_PANICKED", message: `the work threw: ${String(error)}` } };
      } finally {
        clearTimeout(timer);
      }
      await report(url, token, body, deadlineMs);
    })();
    background.add(job);
    void job.finally(() => background.delete(job));
    throw new Accepted();
  }
}

const LATE = Symbol("late");

/** One task result report, retried (capped backoff) while the router is unreachable or unavailable. */
async function report(url: string, token: string, body: unknown, deadlineMs: number): Promise<void> {
  let pauseMs = 100;
  for (;;) {
    let retryable: boolean;
    let why: string;
    try {
      const response = await fetch(url, {
        method: "POST",
        headers: jsonHeaders(token),
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(10_000),
      });
      if (response.ok) return;
      retryable = response.status >= 500 || response.status === 429;
      why = `${response.status} ${await response.text()}`;
    } catch (error) {
      retryable = true;
      why = `cannot reach the router: ${String(error)}`;
    }
    if (!retryable || nowMs() + pauseMs >= deadlineMs) {
      log.error("Task result not reported.", { url, error: why });
      return;
    }
    log.warn("Reporting a task result failed; retrying.", { url, error: why });
    await new Promise((resolve) => setTimeout(resolve, pauseMs));
    pauseMs = Math.min(pauseMs * 2, 5000);
  }
}
