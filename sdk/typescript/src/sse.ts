/**
 * Reading server-sent events (the router's streamed invoke, DESIGN §8 "Streaming", and
 * a task's events, §3.10.3), and the {@link CallStream} a streamed call returns.
 */

import { RouterError, TransportError, routerError } from "./errors.js";
import { envelopeError, invokeResult, isObject, streamResult, text, type StreamResult } from "./wire.js";

export interface ServerEvent {
  event: string;
  data: string;
}

/** The events of a `text/event-stream` body, as they complete. */
export async function* serverEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerEvent> {
  const decoder = new TextDecoder();
  let buffered = "";
  let event = "message";
  let data: string[] = [];
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        let line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length > 0) yield { event, data: data.join("\n") };
          event = "message";
          data = [];
        } else if (line.startsWith(":")) {
          // A comment (keep-alive).
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
      }
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

function parse(data: string): unknown {
  try {
    return JSON.parse(data) as unknown;
  } catch {
    throw new TransportError("INVALID_ANSWER", `an event's data is not JSON: ${data.slice(0, 80)}`);
  }
}

/**
 * A streamed call (`ctx.stream`, `client.stream`): iterate it for the agent's items as
 * they arrive. The stream ends with the router's `event: result`, then available as
 * {@link CallStream.result}; an `event: error` is thrown as the typed {@link RouterError}.
 * Leaving the loop early (`break`) closes the connection, which cancels the agent's work.
 */
export class CallStream<T = unknown> implements AsyncIterable<T> {
  #result: StreamResult | undefined;
  #response: Promise<Response>;
  #abort: AbortController;
  #used = false;

  constructor(response: Promise<Response>, abort: AbortController) {
    this.#response = response;
    this.#abort = abort;
    // Consumed by the iterator; a stream never iterated must not leave an unhandled rejection.
    response.catch(() => undefined);
  }

  /** The router's closing `event: result`, once the stream ended. */
  get result(): StreamResult | undefined {
    return this.#result;
  }

  /** Closes the stream (the agent's work is cancelled). */
  close(): void {
    this.#abort.abort();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    if (this.#used) throw new TypeError("a CallStream is iterated once");
    this.#used = true;
    try {
      const response = await this.#response;
      const type = response.headers.get("content-type") ?? "";
      if (!type.startsWith("text/event-stream") || response.body === null) {
        // Refused before the agent's answer: the failed result envelope, with its status.
        await invokeResult(response);
        throw new TransportError("INVALID_ANSWER", `the router answered ${response.status} without events`, {
          status: response.status,
        });
      }
      for await (const { event, data } of serverEvents(response.body)) {
        if (event === "message") {
          yield parse(data) as T;
        } else if (event === "result") {
          const envelope = parse(data);
          this.#result = streamResult(isObject(envelope) ? envelope : {});
        } else if (event === "error") {
          const error = parse(data);
          if (!isObject(error)) throw new TransportError("INVALID_ANSWER", "an `event: error` without an error");
          throw streamError(error);
        }
      }
      if (this.#result === undefined) {
        throw routerError("STREAM_INTERRUPTED", "the stream ended without the router's `event: result`", {
          retryable: true,
        });
      }
    } finally {
      this.#abort.abort();
    }
  }
}

function streamError(error: Record<string, unknown>): RouterError {
  if (isObject(error["error"])) return envelopeError(error, undefined);
  const details = error["details"];
  return routerError(text(error["code"]) || "INVALID_ANSWER", text(error["message"]), {
    retryable: error["retryable"] === true,
    details: isObject(details) ? (details) : undefined,
  });
}
