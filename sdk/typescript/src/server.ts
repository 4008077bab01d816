/**
 * The inbound side: the agent contract over `node:http` (DESIGN §3.5, §8).
 *
 * `POST /invoke` takes the router's forwarded envelope and answers `200 {"output": ...}`
 * or `{"error": {"code", "message", "details"?}}`; a streaming handler asked with
 * `Accept: text/event-stream` answers server-sent events. `GET /healthz` reports real
 * readiness. Per delivery, in this order: verify the router's assertion → decode the
 * envelope → `source`/`capability` against the assertion → ready? → deadline passed? →
 * which handler → a repeat (dedup by caller and `request_id`)? → room? → validate the
 * payload → run the handler until the deadline (a throw becomes an error answer, the
 * agent keeps serving) → validate and encode the output.
 */

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";

import { AssertionRefused, type Assertion } from "./assertion.js";
import { Ctx, turnsOf, type Budget, type Delivery } from "./ctx.js";
import type { Answer } from "./dedup.js";
import { AgentReachError, HandlerError, Paused } from "./errors.js";
import type { Handler } from "./handler.js";
import { problems } from "./handler.js";
import { log } from "./log.js";
import type { AgentState } from "./state.js";
import { startDelivery } from "./telemetry.js";
import { PRIORITIES, isObject, type Priority } from "./wire.js";

function error(status: number, code: string, message: string, details?: Record<string, unknown>): Answer {
  const body: Record<string, unknown> = { code, message };
  if (details !== undefined) body["details"] = details;
  return { status, body: JSON.stringify({ error: body }), code };
}

function unauthenticated(refused: AssertionRefused): Answer {
  return error(401, "UNAUTHENTICATED", refused.message, { reason: refused.reason });
}

/** A throw from a handler, as its answer. */
function thrown(handler: Handler, caught: unknown): Answer {
  if (caught instanceof Paused) return { status: 200, body: JSON.stringify({ paused: { checkpoint: caught.checkpoint } }), code: "PAUSED" };
  if (caught instanceof HandlerError) return error(caught.status, caught.code, caught.message);
  // A failed call onwards: the caller learns the code at its origin.
  if (caught instanceof AgentReachError) return error(caught.retryable ? 503 : 502, caught.code, caught.message);
  log.error("Handler threw; the agent keeps serving.", { capability: handler.descriptor.name, error: String(caught) });
  const what = caught instanceof Error ? `${caught.name}: ${caught.message}` : String(caught);
  return error(500, "HANDLER_PANICKED", `the handler threw ${what}`);
}

function schemaMismatch(handler: Handler, issues: { pointer: string; message: string }[]): Answer {
  const first = issues[0]?.pointer ?? "";
  return error(
    422,
    "SCHEMA_MISMATCH",
    `payload does not match the input of \`${handler.descriptor.name}\` (${issues.length} problem(s), first at \`${first === "" ? "/" : first}\`)`,
    { errors: issues, total: issues.length },
  );
}

const DEADLINE = Symbol("deadline");

/** The forwarded envelope, decoded and type-checked; an `Answer` when it is not one. */
function decode(body: string, assertion: Assertion | undefined, traceparent: string | undefined): Delivery | Answer {
  let envelope: unknown;
  try {
    envelope = JSON.parse(body);
  } catch {
    return error(400, "INVALID_ENVELOPE", "cannot decode the forwarded envelope: not JSON");
  }
  if (!isObject(envelope)) return error(400, "INVALID_ENVELOPE", "cannot decode the forwarded envelope: not an object");
  const { request_id, capability, capability_version, deadline, source, session_id, context_id, task_id, checkpoint, budget } = envelope;
  const attempt = envelope["attempt"] ?? 1;
  const priority = envelope["priority"] ?? "normal";
  if (
    typeof request_id !== "string" ||
    typeof capability !== "string" ||
    typeof capability_version !== "string" ||
    typeof deadline !== "number" ||
    typeof attempt !== "number" ||
    (session_id !== undefined && typeof session_id !== "string") ||
    (context_id !== undefined && typeof context_id !== "string") ||
    (source !== undefined && typeof source !== "string") ||
    (task_id !== undefined && typeof task_id !== "string") ||
    (budget !== undefined && !isObject(budget)) ||
    !PRIORITIES.includes(priority as Priority)
  ) {
    return error(400, "INVALID_ENVELOPE", "cannot decode the forwarded envelope: a field is missing or has the wrong type");
  }
  return {
    requestId: request_id,
    sessionId: session_id,
    contextId: context_id,
    source,
    tenant: assertion?.tenant,
    capability,
    capabilityVersion: capability_version,
    deadlineMs: deadline,
    attempt,
    priority: priority as Priority,
    traceparent,
    taskId: task_id,
    assertionToken: assertion?.token,
    chain: assertion?.chain,
    budget: isObject(budget) ? budgetOf(budget) : undefined,
    history: envelope["history"] === undefined ? [] : turnsOf(envelope["history"]),
    checkpoint,
    payload: envelope["payload"] ?? null,
  } as Delivery & { payload: unknown };
}

/**
 * One delivery's deadline: `race` settles with the work, or with {@link DEADLINE} when it
 * passes first; the signal (made only if a handler asks for it) aborts then, or when
 * `also` does. One timer, no AbortController unless asked: this runs for every delivery.
 */
class Deadline {
  readonly #deadlineMs: number;
  readonly #also: AbortSignal | undefined;
  #controller: AbortController | undefined;
  #timer: NodeJS.Timeout | undefined;
  #passed = false;

  constructor(deadlineMs: number, also?: AbortSignal) {
    this.#deadlineMs = deadlineMs;
    this.#also = also;
  }

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.#passed) this.#controller.abort(new Error("the deadline passed"));
    }
    return this.#also === undefined ? this.#controller.signal : AbortSignal.any([this.#controller.signal, this.#also]);
  }

  race<T>(work: PromiseLike<T>): Promise<T | typeof DEADLINE> {
    return new Promise((resolve, reject) => {
      this.#timer = setTimeout(() => {
        this.#passed = true;
        this.#controller?.abort(new Error("the deadline passed"));
        resolve(DEADLINE);
      }, Math.max(0, this.#deadlineMs - Date.now()));
      work.then(resolve, reject);
    });
  }

  clear(): void {
    clearTimeout(this.#timer);
  }
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof value === "object" && value !== null && typeof (value as { then?: unknown }).then === "function";
}

/** One handler run to its answer (the handler has its place in flight): at once when the handler answers at once. */
function run(state: AgentState, handler: Handler, delivery: Delivery, payload: unknown): Answer | Promise<Answer> {
  const input = handler.input.safeParse(payload);
  if (!input.success) return schemaMismatch(handler, problems(input.error));
  const span = startDelivery(delivery, state.agentId);
  if (span === undefined) return runHandler(state, handler, delivery, input.data, undefined);
  const answered = runHandler(state, handler, delivery, input.data, span.traceparent);
  const end = (answer: Answer): Answer => {
    span.end(answer.status, answer.code, answer.usage);
    return answer;
  };
  return "status" in answered ? end(answered) : answered.then(end);
}

function runHandler(state: AgentState, handler: Handler, delivery: Delivery, input: unknown, span: string | undefined): Answer | Promise<Answer> {
  const deadline = new Deadline(delivery.deadlineMs);
  const ctx = handler.wantsCtx ? new Ctx(delivery, state.links, deadline, span) : undefined;
  let outcome: unknown;
  try {
    outcome = ctx !== undefined ? handler.run(input, ctx) : (handler.run as (input: unknown) => unknown)(input);
  } catch (caught) {
    return thrown(handler, caught);
  }
  if (!isThenable(outcome)) return output(handler, outcome, ctx);
  return deadline.race(outcome).then(
    (value) => {
      deadline.clear();
      if (value === DEADLINE) return error(504, "DEADLINE_EXCEEDED", "the handler did not finish before the deadline");
      return output(handler, value, ctx);
    },
    (caught: unknown) => {
      deadline.clear();
      return thrown(handler, caught);
    },
  );
}

/** The handler's output checked against its type and encoded, with the usage it reported (DESIGN §3.5) beside it. */
function output(handler: Handler, value: unknown, ctx: Ctx | undefined): Answer {
  const checked = handler.output.safeParse(value);
  if (!checked.success) {
    log.error("Handler output does not match its type.", { capability: handler.descriptor.name, error: checked.error.message });
    return error(500, "INVALID_OUTPUT", `the handler's output does not match its declared type: ${checked.error.message}`);
  }
  const usage = ctx?.usage;
  if (usage !== undefined) {
    return { status: 200, body: `{"output":${JSON.stringify(checked.data ?? null)},"usage":${JSON.stringify(usage)}}`, code: "OK", usage };
  }
  return { status: 200, body: `{"output":${JSON.stringify(checked.data ?? null)}}`, code: "OK" };
}

/** An answer now, or later. */
type Answered = Answer | Promise<Answer | undefined> | undefined;

/**
 * One delivery, from the raw request to the answer; a streaming handler asked for events
 * writes its own answer to `events` and gives undefined. Synchronous as far as it can be
 * (a cached assertion, a handler that answers at once): each await on this path is a
 * microtask per delivery, which the bench shows.
 */
export function serveInvoke(
  state: AgentState,
  authorization: string | undefined,
  traceparent: string | undefined,
  body: string,
  events: ServerResponse | undefined,
): Answered {
  const verifier = state.verifier;
  if (verifier === undefined) return admit(state, undefined, traceparent, body, events);
  const cached = verifier.cached(authorization);
  if (cached !== undefined) return admit(state, cached, traceparent, body, events);
  return verifier.verify(authorization).then(
    (assertion) => admit(state, assertion, traceparent, body, events),
    (caught: unknown) => {
      if (!(caught instanceof AssertionRefused)) throw caught;
      log.info("Delivery refused.", { reason: caught.reason, message: caught.message });
      return unauthenticated(caught);
    },
  );
}

function admit(
  state: AgentState,
  assertion: Assertion | undefined,
  traceparent: string | undefined,
  body: string,
  events: ServerResponse | undefined,
): Answered {
  const decoded = decode(body, assertion, traceparent);
  if ("status" in decoded) return decoded;
  const delivery = decoded as Delivery & { payload: unknown };
  if (assertion !== undefined) {
    if (delivery.source !== assertion.caller) {
      return unauthenticated(
        new AssertionRefused(
          "source_mismatch",
          `the envelope's source ${String(delivery.source)} is not the caller the router vouched for (${assertion.caller})`,
        ),
      );
    }
    if (delivery.capability !== assertion.capability) {
      return unauthenticated(
        new AssertionRefused(
          "capability_mismatch",
          `the envelope asks for \`${delivery.capability}\` but the assertion is for \`${assertion.capability}\``,
        ),
      );
    }
  }
  const phase = state.status.phase;
  if (phase !== "ready") {
    return phase === "starting"
      ? error(503, "NOT_READY", "the agent is still initialising")
      : error(503, "DRAINING", "the agent is shutting down");
  }
  if (Date.now() >= delivery.deadlineMs) {
    return error(504, "DEADLINE_EXCEEDED", "the request's deadline passed before it arrived");
  }
  const handler = state.handler(delivery.capability, delivery.capabilityVersion);
  if (handler === undefined) {
    return error(404, "CAPABILITY_NOT_FOUND", `this agent does not serve \`${delivery.capability}\` ${delivery.capabilityVersion}`);
  }
  if (handler.stream !== undefined && events !== undefined) {
    // Not deduplicated: a stream cannot be replayed, and the router never retries one it began relaying.
    if (state.inflight >= state.maxConcurrency) return error(503, "OVERLOADED", "the agent is at its concurrency limit");
    return stream(state, handler, delivery, delivery.payload, events);
  }
  // Keyed by caller too: one caller's request id never answers another's request.
  const caller = delivery.source ?? "";
  const requestId = delivery.requestId;
  const earlier = state.dedup.get(caller, requestId);
  if (earlier !== undefined) return earlier;
  // "Not now" answers are not kept: a later delivery may find room.
  if (state.inflight >= state.maxConcurrency) return error(503, "OVERLOADED", "the agent is at its concurrency limit");
  state.begin();
  // A preemptible handler's task delivery may be asked to pause (DESIGN §9).
  if (handler.descriptor.preemptible === true && delivery.taskId !== undefined) {
    delivery.pause = { requested: false };
    state.pauses.set(requestId, delivery.pause);
  }
  const ended = (answered: Answer): void => {
    state.end();
    if (delivery.pause !== undefined) state.pauses.delete(requestId);
    // Paused: the resumed delivery (same request id) runs the handler again.
    if (answered.code === "PAUSED") state.dedup.forget(caller, requestId);
  };
  const answer = run(state, handler, delivery, delivery.payload);
  if ("status" in answer) {
    state.dedup.set(caller, requestId, answer);
    ended(answer);
    return answer;
  }
  const later = answer.then((answered) => {
    // Kept as the value from now on: a repeat answers without a microtask.
    state.dedup.replace(caller, requestId, later, answered);
    ended(answered);
    return answered;
  });
  state.dedup.set(caller, requestId, later);
  return later;
}

// === Streaming handlers ===

function dataEvent(item: unknown): string {
  // Encoded JSON has no raw newline, so one `data:` line carries it.
  return `data: ${JSON.stringify(item ?? null)}\n\n`;
}

function errorEvent(answer: Answer): string {
  const parsed = JSON.parse(answer.body) as { error: { code: string; message: string } };
  return `event: error\ndata: ${JSON.stringify({ code: parsed.error.code, message: parsed.error.message })}\n\n`;
}

/**
 * A streaming handler's answer (DESIGN §8): each item one `data:` event as it is yielded;
 * an error after the first item, or the deadline, ends it with `event: error`. The first
 * item is awaited before the answer's head, so a handler that fails at once answers an
 * ordinary error with its status. The caller going away aborts `ctx.signal` and closes
 * the generator (its `finally` blocks run).
 */
async function stream(
  state: AgentState,
  handler: Handler,
  delivery: Delivery,
  payload: unknown,
  response: ServerResponse,
): Promise<Answer | undefined> {
  const item = handler.item;
  const open = handler.stream;
  if (item === undefined || open === undefined) throw new TypeError("not a streaming handler");
  const input = handler.input.safeParse(payload);
  if (!input.success) return schemaMismatch(handler, problems(input.error));
  state.begin();
  const gone = new AbortController();
  const isGone = (): boolean => gone.signal.aborted;
  const onClose = (): void => {
    if (!response.writableFinished) gone.abort(new Error("the caller went away"));
  };
  response.on("close", onClose);
  const deadline = new Deadline(delivery.deadlineMs, gone.signal);
  const iterator = open(input.data, new Ctx(delivery, state.links, deadline))[Symbol.asyncIterator]();
  const next = async (): Promise<{ item: unknown } | "end" | Answer> => {
    try {
      const pulled = await deadline.race(iterator.next());
      deadline.clear();
      if (pulled === DEADLINE) return error(504, "DEADLINE_EXCEEDED", "the handler did not finish before the deadline");
      if (pulled.done === true) return "end";
      const checked = item.safeParse(pulled.value);
      if (!checked.success) {
        return error(500, "INVALID_OUTPUT", `the handler's item does not match its declared type: ${checked.error.message}`);
      }
      return { item: checked.data };
    } catch (caught) {
      return thrown(handler, caught);
    }
  };
  let ended = false;
  try {
    const first = await next();
    if (first === "end") {
      ended = true;
      return { status: 200, body: '{"output":[]}', code: "OK" };
    }
    if ("status" in first) {
      ended = true;
      return first;
    }
    response.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    response.write(dataEvent(first.item));
    for (;;) {
      if (isGone()) return undefined;
      const pulled = await next();
      if (pulled === "end") {
        ended = true;
        response.end();
        return undefined;
      }
      if ("status" in pulled) {
        ended = true;
        if (!isGone()) response.end(errorEvent(pulled));
        return undefined;
      }
      response.write(dataEvent(pulled.item));
    }
  } finally {
    response.off("close", onClose);
    if (!ended) gone.abort(new Error("the stream ended"));
    // Runs the generator's `finally` (at once when it is suspended at a `yield`).
    void Promise.resolve(iterator.return?.()).catch(() => undefined);
    state.end();
  }
}

// === HTTP ===

function answer(response: ServerResponse, answered: Answer): void {
  response.writeHead(answered.status, ["content-type", "application/json", "content-length", String(Buffer.byteLength(answered.body))]);
  response.end(answered.body);
}

/** Reads the body (up to `limit` bytes; undefined beyond), then calls `done`: no promise per request. */
function readBody(request: IncomingMessage, limit: number, done: (body: string | undefined) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  request.on("data", (chunk: Buffer) => {
    size += chunk.length;
    if (size <= limit) chunks.push(chunk);
  });
  request.on("end", () => {
    done(size > limit ? undefined : chunks.length === 1 ? (chunks[0] ?? Buffer.alloc(0)).toString() : Buffer.concat(chunks).toString());
  });
}

function failed(response: ServerResponse, caught: unknown): void {
  log.error("Delivery failed.", { error: String(caught) });
  if (!response.headersSent) answer(response, error(500, "INTERNAL", "the agent failed to answer"));
  else response.destroy();
}

function healthz(state: AgentState | undefined, response: ServerResponse): void {
  if (state === undefined) {
    answer(response, { status: 503, body: JSON.stringify({ status: "stopped", healthy: false }), code: "" });
    return;
  }
  const status = state.currentStatus();
  const healthy = (status === "ready" || status === "busy") && state.heartbeatFresh() && state.inflight < state.maxConcurrency;
  const body = JSON.stringify({ status, inflight: state.inflight, max_concurrency: state.maxConcurrency, healthy });
  answer(response, { status: healthy ? 200 : 503, body, code: "" });
}

/**
 * The router's pause request for a running delivery (DESIGN §9): `{request_id, capability}`
 * with `x-agent-reach-control: pause`, under its assertion for that capability. `202` when
 * the delivery runs here (its handler sees `ctx.pauseRequested`), `404` otherwise.
 */
async function serveControl(state: AgentState, authorization: string | undefined, body: string): Promise<Answer> {
  let assertion: Assertion | undefined;
  if (state.verifier !== undefined) {
    try {
      assertion = await state.verifier.verify(authorization);
    } catch (caught) {
      if (!(caught instanceof AssertionRefused)) throw caught;
      return unauthenticated(caught);
    }
  }
  let request: unknown;
  try {
    request = JSON.parse(body);
  } catch {
    request = undefined;
  }
  if (!isObject(request) || typeof request["request_id"] !== "string" || typeof request["capability"] !== "string") {
    return error(400, "INVALID_ENVELOPE", "a pause request is {request_id, capability}");
  }
  if (assertion !== undefined && assertion.capability !== request["capability"]) {
    return unauthenticated(new AssertionRefused("capability_mismatch", "the assertion is for another capability"));
  }
  const pause = state.pauses.get(request["request_id"]);
  if (pause === undefined) return error(404, "NOT_FOUND", "no preemptible delivery of that request id runs here");
  pause.requested = true;
  log.info("Pause requested.", { request_id: request["request_id"] });
  return { status: 202, body: '{"pause":"requested"}', code: "OK" };
}

/** The agent's HTTP server: `POST /invoke`, `GET /healthz`. */
export function agentServer(stateOf: () => AgentState | undefined): Server {
  const server = createServer({ noDelay: true, keepAlive: true }, (request, response) => {
    const url = request.url ?? "";
    const path = url.includes("?") ? url.slice(0, url.indexOf("?")) : url;
    if (request.method === "POST" && path === "/invoke") {
      const state = stateOf();
      if (state === undefined) {
        answer(response, error(503, "NOT_READY", "the agent has not started"));
        return;
      }
      // The three headers read from the raw list: `request.headers` builds an object of them all.
      let authorization: string | undefined;
      let trace: string | undefined;
      let wantsEvents = false;
      let control = false;
      const raw = request.rawHeaders;
      for (let index = 0; index + 1 < raw.length; index += 2) {
        const name = raw[index] ?? "";
        if (name.length === 13 && name.toLowerCase() === "authorization") authorization = raw[index + 1];
        else if (name.length === 11 && name.toLowerCase() === "traceparent") trace = raw[index + 1];
        else if (name.length === 6 && name.toLowerCase() === "accept") wantsEvents = (raw[index + 1] ?? "").toLowerCase().includes("text/event-stream");
        else if (name.length === 21 && name.toLowerCase() === "x-agent-reach-control") control = raw[index + 1] === "pause";
      }
      readBody(request, state.maxBodyBytes, (body) => {
        if (control && body !== undefined) {
          serveControl(state, authorization, body).then(
            (answered) => {
              answer(response, answered);
            },
            (caught: unknown) => {
              failed(response, caught);
            },
          );
          return;
        }
        let answered: Answered;
        try {
          answered =
            body === undefined
              ? error(413, "PAYLOAD_TOO_LARGE", `the envelope exceeds ${state.maxBodyBytes} bytes`)
              : serveInvoke(state, authorization, trace, body, wantsEvents ? response : undefined);
        } catch (caught) {
          failed(response, caught);
          return;
        }
        if (answered === undefined) return;
        if ("status" in answered) {
          answer(response, answered);
          return;
        }
        answered.then(
          (later) => {
            if (later !== undefined) answer(response, later);
          },
          (caught: unknown) => {
            failed(response, caught);
          },
        );
      });
      return;
    }
    if (request.method === "GET" && path === "/healthz") {
      healthz(stateOf(), response);
      return;
    }
    request.resume();
    answer(response, error(404, "NOT_FOUND", "agent routes: POST /invoke, GET /healthz"));
  });
  // The router keeps connections pooled; close idle ones later than it reuses them.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 70_000;
  return server;
}

/** The envelope's `budget` (`{calls_left?, cost_left?}`) as a `Budget`; a member that is not a number is left out. */
function budgetOf(budget: Record<string, unknown>): Budget {
  const { calls_left: calls, cost_left: cost } = budget;
  return {
    ...(typeof calls === "number" ? { callsLeft: calls } : {}),
    ...(typeof cost === "number" ? { costLeft: cost } : {}),
  };
}
