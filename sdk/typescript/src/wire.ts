/**
 * The JSON shapes of the HTTP APIs (DESIGN §2.6, §3.2, §3.7, §4.4), built and decoded in
 * one place for the agent side ({@link Ctx}) and the caller side ({@link Client}), and
 * the one `fetch` wrapper that turns a failed connection into a {@link TransportError}.
 */

import { randomBytes } from "node:crypto";

import {
  AgentReachError,
  ContextError,
  ContextNotFound,
  LeaseExpired,
  RegistryError,
  RouterError,
  TransportError,
  VersionConflict,
  routerError,
  type Details,
} from "./errors.js";

export const ENVELOPE_VERSION = "1.0";

/** How the router picks an instance (`target_policy`); `plugin:NAME` names a policy plugged into the router. */
export type Policy =
  | "weighted_round_robin"
  | "least_connections"
  | "consistent_hash"
  | "p2c_ewma"
  | "adaptive"
  | `plugin:${string}`;
export type Priority = "high" | "normal" | "low";
export const PRIORITIES: readonly Priority[] = ["high", "normal", "low"];

/** Options of a call through the router. */
export interface CallOptions {
  /** A semver requirement (`"^1.2"`, `"=1.2.0"`); absent: the highest version. */
  version?: string;
  policy?: Policy;
  priority?: Priority;
  /** The time allowed, in milliseconds (on an agent: never past its own request's deadline). */
  timeoutMs?: number;
  sessionId?: string;
  contextId?: string;
  /** The idempotency key; generated when absent ({@link newRequestId}). */
  requestId?: string;
}

/** A succeeded result envelope (DESIGN §3.7). */
export interface InvokeResult<T = unknown> {
  requestId: string;
  capability: string;
  capabilityVersion: string;
  agentId: string;
  attempts: number;
  durationMs: number;
  output: T;
  /** The envelope as the router sent it. */
  envelope: Record<string, unknown>;
}

/**
 * What serving a call cost an agent (DESIGN §3.5 `usage`), sent beside its output: `cost` in
 * the abstract unit a delegation budget counts, the model's tokens and its name.
 */
export interface Usage {
  cost: number;
  input_tokens?: number;
  output_tokens?: number;
  model?: string;
}

/** The router's `event: result` ending a stream (the result envelope without `output`). */
export interface StreamResult {
  requestId: string;
  capability: string;
  capabilityVersion: string;
  agentId: string;
  attempts: number;
  events: number;
  durationMs: number;
  envelope: Record<string, unknown>;
}

/**
 * A request id shaped as the router and the other SDKs make them: the epoch
 * milliseconds as 12 hex digits, then 16 random ones (the trail finds an id
 * of that shape by its time, with no index write).
 */
export function newRequestId(): string {
  return Date.now().toString(16).padStart(12, "0") + randomBytes(8).toString("hex");
}

export function nowMs(): number {
  return Date.now();
}

export interface EnvelopeFields extends CallOptions {
  deadlineMs?: number | undefined;
}

/** The `POST /v1/invoke` request envelope; absent options are left out (the router's defaults). */
export function invokeBody(capability: string, payload: unknown, options: EnvelopeFields): Record<string, unknown> {
  const body: Record<string, unknown> = {
    version: ENVELOPE_VERSION,
    request_id: options.requestId ?? newRequestId(),
    capability,
    payload: payload ?? null,
  };
  if (options.version !== undefined) body["capability_version"] = options.version;
  if (options.policy !== undefined) body["target_policy"] = options.policy;
  if (options.priority !== undefined) body["priority"] = options.priority;
  if (options.deadlineMs !== undefined) body["deadline"] = Math.floor(options.deadlineMs);
  else if (options.timeoutMs !== undefined) body["timeout_ms"] = Math.max(1, Math.floor(options.timeoutMs));
  if (options.sessionId !== undefined) body["session_id"] = options.sessionId;
  if (options.contextId !== undefined) body["context_id"] = options.contextId;
  return body;
}

export type Service = "router" | "registry" | "context";

/** `fetch`, with a failure to connect (or the time bound) as a retryable `*_UNREACHABLE`. */
export async function send(service: Service, url: string, init: RequestInit & { timeoutMs?: number }): Promise<Response> {
  const { timeoutMs, ...rest } = init;
  const signal = timeoutMs === undefined ? rest.signal : AbortSignal.timeout(Math.max(1, timeoutMs));
  try {
    return await fetch(url, { ...rest, signal: signal ?? null });
  } catch (error) {
    throw unreachable(service, url, error);
  }
}

export function unreachable(service: Service, url: string, error: unknown): TransportError {
  const why = error instanceof Error ? (error.cause instanceof Error ? error.cause.message : error.message) : String(error);
  return new TransportError(`${service.toUpperCase()}_UNREACHABLE`, `cannot reach the ${service} at ${url}: ${why}`, {
    retryable: true,
  });
}

/** A capability a caller may call, as the router offers it (its MCP door's `tools/list`). */
export interface CapabilityOffer {
  /** The capability's name (`order.query`). */
  name: string;
  description: string;
  /** Its input JSON Schema; an input that is not an object is wrapped as `{input: …}` (`inputWrapped`). */
  inputSchema: Record<string, unknown>;
  /** Whether the payload is the `input` argument (the capability's input is not an object). */
  inputWrapped: boolean;
  outputSchema: Record<string, unknown> | undefined;
}

/** Whether `schema` is exactly the router's wrapper of a non-object input (`{input: …}`). */
function isWrapped(schema: Record<string, unknown>): boolean {
  const keys = Object.keys(schema);
  const properties = isObject(schema["properties"]) ? Object.keys(schema["properties"]) : [];
  const required = schema["required"];
  return (
    keys.every((key) => ["type", "properties", "required", "$schema", "$defs", "definitions"].includes(key)) &&
    properties.length === 1 &&
    properties[0] === "input" &&
    Array.isArray(required) &&
    required.length === 1 &&
    required[0] === "input"
  );
}

/** The capabilities the bearer of `token` may call under the router's `acl.yaml`, each at its highest version. */
export async function listCapabilities(router: string, token: string): Promise<CapabilityOffer[]> {
  const url = `${router.replace(/\/+$/, "")}/mcp`;
  const response = await send("router", url, {
    method: "POST",
    headers: jsonHeaders(token, { accept: "application/json, text/event-stream" }),
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
    timeoutMs: 30_000,
  });
  const answer = await decodeJson(response, "router");
  const result = isObject(answer) ? answer["result"] : undefined;
  if (!response.ok || !isObject(result) || !Array.isArray(result["tools"])) {
    const refusal = isObject(answer) && isObject(answer["error"]) ? answer["error"] : {};
    const data = isObject(refusal["data"]) ? refusal["data"] : {};
    const code = typeof data["code"] === "string" ? data["code"] : "INVALID_ANSWER";
    const message = typeof refusal["message"] === "string" ? refusal["message"] : "";
    throw routerError(code, `the router's tools/list answered ${response.status}: ${message}`, {
      status: response.status,
    });
  }
  return (result["tools"] as unknown[]).filter(isObject).map((tool) => {
    const inputSchema = isObject(tool["inputSchema"]) ? tool["inputSchema"] : { type: "object" };
    return {
      name: String(tool["name"]),
      description: typeof tool["description"] === "string" ? tool["description"] : "",
      inputSchema,
      inputWrapped: isWrapped(inputSchema),
      outputSchema: isObject(tool["outputSchema"]) ? tool["outputSchema"] : undefined,
    };
  });
}

export function jsonHeaders(token: string, extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Bearer ${token}`, "content-type": "application/json", ...extra };
}

export async function decodeJson(response: Response, service: Service): Promise<unknown> {
  const text = await response.text();
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new TransportError("INVALID_ANSWER", `the ${service} answered ${response.status} with a body that is not JSON`, {
      status: response.status,
    });
  }
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `value` when it is a string, else "" (an answer's field read without trusting it). */
export function text(value: unknown): string {
  return typeof value === "string" ? value : "";
}

/** `value` when it is a number, else 0. */
export function count(value: unknown): number {
  return typeof value === "number" ? value : 0;
}

/** The typed error of a failed result envelope. */
export function envelopeError(envelope: Record<string, unknown>, status: number | undefined): RouterError {
  const error = isObject(envelope["error"]) ? envelope["error"] : {};
  const details = error["details"];
  return routerError(
    text(error["code"]) || "INVALID_ANSWER",
    text(error["message"]) || "the router answered a failed envelope without an error",
    {
      status,
      retryable: error["retryable"] === true,
      details: isObject(details) ? (details) : undefined,
      requestId: text(envelope["request_id"]) || undefined,
      envelope,
    },
  );
}

/** The router's result envelope: the result, or its typed error. */
export async function invokeResult<T>(response: Response): Promise<InvokeResult<T>> {
  const envelope = await decodeJson(response, "router");
  if (!isObject(envelope) || (envelope["status"] !== "succeeded" && envelope["status"] !== "failed")) {
    throw new TransportError("INVALID_ANSWER", `the router answered ${response.status} without a result envelope`, {
      status: response.status,
    });
  }
  if (envelope["status"] === "failed") throw envelopeError(envelope, response.status);
  return {
    requestId: text(envelope["request_id"]),
    capability: text(envelope["capability"]),
    capabilityVersion: text(envelope["capability_version"]),
    agentId: text(envelope["agent_id"]),
    attempts: count(envelope["attempts"]),
    durationMs: count(envelope["duration_ms"]),
    output: (envelope["output"] ?? null) as T,
    envelope,
  };
}

export function streamResult(envelope: Record<string, unknown>): StreamResult {
  return {
    requestId: text(envelope["request_id"]),
    capability: text(envelope["capability"]),
    capabilityVersion: text(envelope["capability_version"]),
    agentId: text(envelope["agent_id"]),
    attempts: count(envelope["attempts"]),
    events: count(envelope["events"]),
    durationMs: count(envelope["duration_ms"]),
    envelope,
  };
}

/** A router answer outside `/v1/invoke` (tasks, session results): the body, or its typed error. */
export async function routerAnswer(response: Response): Promise<Record<string, unknown>> {
  const body = await decodeJson(response, "router");
  if (response.ok && isObject(body)) return body;
  if (isObject(body) && isObject(body["error"])) throw envelopeError(body, response.status);
  throw new TransportError("INVALID_ANSWER", `the router answered ${response.status} with an unexpected body`, {
    status: response.status,
  });
}

/** A registry or context answer: the decoded body (`undefined` for 204), or the typed error it describes. */
export async function serviceAnswer(response: Response, service: "registry" | "context"): Promise<unknown> {
  if (response.status === 204) return undefined;
  const body = await decodeJson(response, service);
  if (response.ok) return body;
  throw serviceError(service, response.status, body);
}

export function serviceError(service: "registry" | "context", status: number, body: unknown): AgentReachError {
  const error = isObject(body) && isObject(body["error"]) ? body["error"] : undefined;
  if (error === undefined || typeof error["code"] !== "string") {
    return new TransportError("INVALID_ANSWER", `the ${service} answered ${status} without an error body`, { status });
  }
  const code = error["code"];
  const fields = {
    status,
    retryable: status >= 500,
    details: isObject(error["details"]) ? (error["details"] as Details) : undefined,
    field: typeof error["field"] === "string" ? error["field"] : undefined,
  };
  const message = text(error["message"]);
  if (service === "registry") {
    return code === "LEASE_EXPIRED" ? new LeaseExpired(code, message, fields) : new RegistryError(code, message, fields);
  }
  if (code === "VERSION_CONFLICT") return new VersionConflict(code, message, fields);
  if (code === "CONTEXT_NOT_FOUND") return new ContextNotFound(code, message, fields);
  return new ContextError(code, message, fields);
}

/** A child W3C `traceparent`: the parent's trace id (a fresh one without a parent), a new span id. */
export function childTraceparent(parent: string | undefined): string {
  const trace = parent?.split("-")[1];
  const traceId = trace?.length === 32 ? trace : randomBytes(16).toString("hex");
  return `00-${traceId}-${randomBytes(8).toString("hex")}-01`;
}
