/**
 * Calling capabilities from programs that are not agents: the router's caller API
 * (`POST /v1/invoke`, streamed or not, DESIGN §3.2, §8), durable tasks (§3.10) and the
 * context service (§4). Failures throw the typed errors of `errors.ts`.
 *
 * ```ts
 * const client = new Client({ router: "http://router:7500", token });
 * const result = await client.invoke("order.query", { order_id: "SO-2024001" }, { version: "^1.2" });
 * for await (const token of client.stream("text.generate", { prompt })) process.stdout.write(token.text);
 * ```
 */

import { createHmac, timingSafeEqual } from "node:crypto";

import { Contexts } from "./contexts.js";
import { ConfigError, TransportError } from "./errors.js";
import { CallStream } from "./sse.js";
import {
  childTraceparent,
  envelopeError,
  invokeBody,
  invokeResult,
  isObject,
  jsonHeaders,
  listCapabilities,
  routerAnswer,
  text,
  count,
  send,
  type CallOptions,
  type InvokeResult,
  type CapabilityOffer,
} from "./wire.js";

export interface ClientOptions {
  router?: string;
  /** The context service (for `client.contexts`). */
  context?: string;
  /** A JWT whose `sub` is the caller's name. */
  token: string;
  /** Bound of a call without `timeoutMs` (default 60 s). */
  timeoutMs?: number;
}

export type TaskStatus = "pending" | "running" | "retrying" | "succeeded" | "failed" | "canceled" | "paused";
const TERMINAL: readonly string[] = ["succeeded", "failed", "canceled"];

/** The answer to a task submission: stored (202), or the existing task of a repeated `request_id`. */
export interface TaskAccepted {
  taskId: string;
  status: TaskStatus;
  duplicate: boolean;
}

/** A task as the router reports it; `result` is its result envelope once it ended. */
export interface TaskView {
  taskId: string;
  status: TaskStatus;
  attempts: number;
  requestId: string;
  sessionId: string | undefined;
  capability: string;
  result: Record<string, unknown> | undefined;
  transitions: { status: string; at: number }[];
}

export interface TaskOptions extends CallOptions {
  /** Gets the result envelope, signed (see {@link verifyCallback}). */
  callbackUrl?: string;
  callbackSecretRef?: string;
}

export interface SessionResults {
  sessionId: string;
  results: { cursor: string; taskId: string; status: string; result: Record<string, unknown> | undefined }[];
  /** Pass as `after` for the next page. */
  nextAfter: string | undefined;
}

function taskView(body: Record<string, unknown>): TaskView {
  const result = body["result"];
  return {
    taskId: text(body["task_id"]),
    status: text(body["status"]) as TaskStatus,
    attempts: count(body["attempts"]),
    requestId: text(body["request_id"]),
    sessionId: typeof body["session_id"] === "string" ? body["session_id"] : undefined,
    capability: text(body["capability"]),
    result: isObject(result) ? result : undefined,
    transitions: Array.isArray(body["transitions"]) ? (body["transitions"] as TaskView["transitions"]) : [],
  };
}

/** A task's output; a failed or canceled task throws its typed error. */
export function taskOutput(task: TaskView): unknown {
  if (task.result === undefined) {
    throw new TransportError("TASK_NOT_DONE", `task \`${task.taskId}\` is \`${task.status}\`, without a result yet`);
  }
  if (task.result["status"] !== "succeeded") throw envelopeError(task.result, undefined);
  return task.result["output"] ?? null;
}

export class Client {
  readonly #router: string | undefined;
  readonly #token: string;
  readonly #timeoutMs: number;
  /** The context service's API (`create`, `get`, `patch`, `close`), when `context` was given. */
  readonly contexts: Contexts | undefined;

  constructor(options: ClientOptions) {
    const problems: string[] = [];
    if (options.router === undefined && options.context === undefined) {
      problems.push("give router (capabilities, tasks) and/or context (the context service)");
    }
    if (options.token === "") problems.push("no token: pass token (a JWT whose sub is the caller's name)");
    if (problems.length > 0) throw new ConfigError(problems);
    this.#router = options.router?.replace(/\/+$/, "");
    this.#token = options.token;
    this.#timeoutMs = options.timeoutMs ?? 60_000;
    this.contexts = options.context === undefined ? undefined : new Contexts(options.context, options.token);
  }

  #url(path: string): string {
    if (this.#router === undefined) throw new ConfigError(["this client was built without router"]);
    return `${this.#router}${path}`;
  }

  #headers(accept = "application/json"): Record<string, string> {
    return jsonHeaders(this.#token, { traceparent: childTraceparent(undefined), accept });
  }

  /** The capabilities this client's token may call under the router's `acl.yaml` (e.g. to offer them as a model's tools). */
  async capabilities(): Promise<CapabilityOffer[]> {
    return listCapabilities(this.#url(""), this.#token);
  }

  /** Calls `capability` and waits for its result envelope; a failure throws the typed error. */
  async invoke<T = unknown>(capability: string, payload: unknown, options: CallOptions = {}): Promise<InvokeResult<T>> {
    const response = await send("router", this.#url("/v1/invoke"), {
      method: "POST",
      headers: this.#headers(),
      body: JSON.stringify(invokeBody(capability, payload, options)),
      timeoutMs: options.timeoutMs === undefined ? this.#timeoutMs : options.timeoutMs + 2000,
    });
    return invokeResult<T>(response);
  }

  /** Calls `capability` as a stream: iterate for the agent's items; `.result` is the router's closing result. */
  stream<T = unknown>(capability: string, payload: unknown, options: CallOptions = {}): CallStream<T> {
    const abort = new AbortController();
    const bound = options.timeoutMs === undefined ? this.#timeoutMs : options.timeoutMs + 2000;
    const response = send("router", this.#url("/v1/invoke"), {
      method: "POST",
      headers: this.#headers("text/event-stream"),
      body: JSON.stringify(invokeBody(capability, payload, options)),
      signal: AbortSignal.any([abort.signal, AbortSignal.timeout(bound)]),
    });
    return new CallStream<T>(response, abort);
  }

  /** Submits a durable task, answered once stored; a repeated `requestId` returns the existing task. */
  async submitTask(capability: string, payload: unknown, options: TaskOptions = {}): Promise<TaskAccepted> {
    const { callbackUrl, callbackSecretRef, ...call } = options;
    const body = invokeBody(capability, payload, call);
    if (callbackUrl !== undefined) {
      body["callback"] = callbackSecretRef === undefined ? { url: callbackUrl } : { url: callbackUrl, secret_ref: callbackSecretRef };
    }
    const answer = await routerAnswer(
      await send("router", this.#url("/v1/tasks"), {
        method: "POST",
        headers: this.#headers(),
        body: JSON.stringify(body),
        timeoutMs: this.#timeoutMs,
      }),
    );
    return {
      taskId: text(answer["task_id"]),
      status: text(answer["status"]) as TaskStatus,
      duplicate: answer["duplicate"] === true,
    };
  }

  async task(taskId: string): Promise<TaskView> {
    const response = await send("router", this.#url(`/v1/tasks/${encodeURIComponent(taskId)}`), {
      headers: this.#headers(),
      timeoutMs: this.#timeoutMs,
    });
    return taskView(await routerAnswer(response));
  }

  async cancelTask(taskId: string): Promise<TaskView> {
    const response = await send("router", this.#url(`/v1/tasks/${encodeURIComponent(taskId)}/cancel`), {
      method: "POST",
      headers: this.#headers(),
      timeoutMs: this.#timeoutMs,
    });
    return taskView(await routerAnswer(response));
  }

  /** Polls the task until it ends; throws a `TASK_WAIT_TIMEOUT` {@link TransportError} past `timeoutMs`. */
  async waitTask(taskId: string, options: { timeoutMs?: number; pollMs?: number } = {}): Promise<TaskView> {
    const deadline = Date.now() + (options.timeoutMs ?? 60_000);
    for (;;) {
      const view = await this.task(taskId);
      if (TERMINAL.includes(view.status)) return view;
      if (Date.now() >= deadline) {
        throw new TransportError("TASK_WAIT_TIMEOUT", `task \`${taskId}\` still \`${view.status}\` after ${options.timeoutMs ?? 60_000} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, options.pollMs ?? 100));
    }
  }

  /**
   * Reports the outcome of a task delivery this agent answered `202` (DESIGN §3.10.5):
   * `{output}` or `{error: {code, message}}`, as the agent the delivery went to (this
   * client's token). The same report again answers `duplicate: true`; another agent's is
   * {@link Forbidden}. `ctx.acceptAndReport` does this for a handler, with retries.
   */
  async reportResult(
    taskId: string,
    outcome: { output: unknown } | { error: { code: string; message: string } },
  ): Promise<{ taskId: string; status: TaskStatus; duplicate: boolean }> {
    const response = await send("router", this.#url(`/v1/tasks/${encodeURIComponent(taskId)}/result`), {
      method: "POST",
      headers: this.#headers(),
      body: JSON.stringify(outcome),
      timeoutMs: this.#timeoutMs,
    });
    const answer = await routerAnswer(response);
    return { taskId: text(answer["task_id"]), status: text(answer["status"]) as TaskStatus, duplicate: answer["duplicate"] === true };
  }

  /** A session's finished tasks after the cursor `after` (what a caller missed while away). */
  async sessionResults(sessionId: string, options: { after?: string; limit?: number } = {}): Promise<SessionResults> {
    const query = new URLSearchParams();
    if (options.after !== undefined) query.set("after", options.after);
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    const suffix = query.size > 0 ? `?${query.toString()}` : "";
    const response = await send("router", this.#url(`/v1/sessions/${encodeURIComponent(sessionId)}/results${suffix}`), {
      headers: this.#headers(),
      timeoutMs: this.#timeoutMs,
    });
    const body = await routerAnswer(response);
    const results = Array.isArray(body["results"]) ? (body["results"] as unknown[]) : [];
    return {
      sessionId: text(body["session_id"]),
      results: results.filter(isObject).map((entry) => ({
        cursor: text(entry["cursor"]),
        taskId: text(entry["task_id"]),
        status: text(entry["status"]),
        result: isObject(entry["result"]) ? entry["result"] : undefined,
      })),
      nextAfter: typeof body["next_after"] === "string" ? body["next_after"] : undefined,
    };
  }
}

/**
 * Checks a task callback's `X-Agent-Reach-Signature: t=<unix>,v1=<hex>` (HMAC-SHA256 of
 * `"<t>.<body>"`, DESIGN §3.10.6) in constant time, refusing timestamps older than
 * `maxAgeS` (replays).
 */
export function verifyCallback(secret: Uint8Array | string, header: string, body: Uint8Array | string, maxAgeS = 300): boolean {
  let timestamp: number | undefined;
  let signature: Buffer | undefined;
  for (const part of header.split(",")) {
    const [name, value = ""] = part.split("=", 2);
    if (name === "t" && /^\d+$/.test(value)) timestamp = Number(value);
    else if (name === "v1" && /^[0-9a-f]+$/i.test(value)) signature = Buffer.from(value, "hex");
  }
  if (timestamp === undefined || signature === undefined) return false;
  if (Math.abs(Date.now() / 1000 - timestamp) > maxAgeS) return false;
  const expected = createHmac("sha256", secret).update(`${timestamp}.`).update(body).digest();
  return expected.length === signature.length && timingSafeEqual(expected, signature);
}
