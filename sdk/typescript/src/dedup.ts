/**
 * Deduplication by request id (DESIGN §3.5): a repeat gets the first answer, a
 * concurrent repeat waits for it. Bounded in size and age (10,000 ids, 10 minutes), as
 * the Rust and Python SDKs. Keyed by caller and request id: one caller's request id never
 * answers another's request.
 *
 * Every delivery leaves its answer here for minutes, so what is kept is kept small: a
 * succeeded answer as its body alone, the ids' order in a ring of callers, ids and times
 * (no object per entry), one map per caller (no key built per delivery). Retained objects
 * are what the garbage collector copies; the bench showed the first version, an object per
 * entry, costing more than the schema checks.
 */

import type { Usage } from "./wire.js";

/** A finished answer: HTTP status, JSON body, and its code (`OK` or the error's). */
export interface Answer {
  status: number;
  body: string;
  code: string;
  /** The usage the handler reported, already in `body`; kept for its span. */
  usage?: Usage;
}

/** An answer as remembered: a 200 answer's body, another answer, or one still being made. */
type Kept = string | Answer | Promise<Answer | undefined>;

export class Dedup {
  readonly #capacity: number;
  readonly #ttlMs: number;
  /** caller ("" when unverified) → request id → answer. */
  readonly #kept = new Map<string, Map<string, Kept>>();
  // The ring, oldest first from `#head`.
  readonly #callers: (string | undefined)[];
  readonly #ids: (string | undefined)[];
  readonly #times: Float64Array;
  #head = 0;
  #count = 0;

  constructor(capacity = 10_000, ttlMs = 600_000) {
    this.#capacity = Math.max(1, capacity);
    this.#ttlMs = ttlMs;
    this.#callers = new Array<string | undefined>(this.#capacity).fill(undefined);
    this.#ids = new Array<string | undefined>(this.#capacity).fill(undefined);
    this.#times = new Float64Array(this.#capacity);
  }

  /** The earlier answer to `caller`'s `requestId`, if one was (or is being) given. */
  get(caller: string, requestId: string): Answer | Promise<Answer | undefined> | undefined {
    const kept = this.#kept.get(caller)?.get(requestId);
    return typeof kept === "string" ? { status: 200, body: kept, code: "OK" } : kept;
  }

  /** Keeps `answer` as the one to `caller`'s `requestId` (one not kept already). */
  set(caller: string, requestId: string, answer: Answer | Promise<Answer | undefined>): void {
    const now = performance.now();
    while (this.#count > 0 && (this.#count === this.#capacity || now - (this.#times[this.#head] ?? 0) >= this.#ttlMs)) {
      const oldCaller = this.#callers[this.#head];
      const oldId = this.#ids[this.#head];
      if (oldCaller !== undefined && oldId !== undefined) {
        const ids = this.#kept.get(oldCaller);
        ids?.delete(oldId);
        if (ids?.size === 0) this.#kept.delete(oldCaller);
      }
      this.#callers[this.#head] = undefined;
      this.#ids[this.#head] = undefined;
      this.#head = (this.#head + 1) % this.#capacity;
      this.#count -= 1;
    }
    let ids = this.#kept.get(caller);
    if (ids === undefined) {
      ids = new Map();
      this.#kept.set(caller, ids);
    }
    ids.set(requestId, Dedup.#compact(answer));
    const slot = (this.#head + this.#count) % this.#capacity;
    this.#callers[slot] = caller;
    this.#ids[slot] = requestId;
    this.#times[slot] = now;
    this.#count += 1;
  }

  /** Forgets the answer to `caller`'s `requestId` (a pause: its resumed delivery runs the handler again). */
  forget(caller: string, requestId: string): void {
    this.#kept.get(caller)?.delete(requestId);
  }

  /** Replaces the pending answer `pending` by its value, once known. */
  replace(caller: string, requestId: string, pending: Promise<Answer | undefined>, answer: Answer): void {
    const ids = this.#kept.get(caller);
    if (ids?.get(requestId) === pending) ids.set(requestId, Dedup.#compact(answer));
  }

  static #compact(answer: Answer | Promise<Answer | undefined>): Kept {
    return "status" in answer && answer.status === 200 && answer.code === "OK" ? answer.body : answer;
  }
}
