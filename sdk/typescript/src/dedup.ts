/**
 * Deduplication by request id (DESIGN §3.5): a repeat gets the first answer, a
 * concurrent repeat waits for it. Bounded in size and age (10,000 ids, 10 minutes), as
 * the Rust and Python SDKs.
 *
 * Every delivery leaves its answer here for minutes, so what is kept is kept small: a
 * succeeded answer as its body alone, the ids' order in a ring of keys and times (no
 * object per entry). Retained objects are what the garbage collector copies; the bench
 * showed the first version, an object per entry, costing more than the schema checks.
 */

/** A finished answer: HTTP status, JSON body, and its code (`OK` or the error's). */
export interface Answer {
  status: number;
  body: string;
  code: string;
}

/** An answer as remembered: a 200 answer's body, another answer, or one still being made. */
type Kept = string | Answer | Promise<Answer | undefined>;

export class Dedup {
  readonly #capacity: number;
  readonly #ttlMs: number;
  readonly #kept = new Map<string, Kept>();
  // The ring, oldest first from `#head`: ids and when they were kept.
  readonly #keys: (string | undefined)[];
  readonly #times: Float64Array;
  #head = 0;
  #count = 0;

  constructor(capacity = 10_000, ttlMs = 600_000) {
    this.#capacity = Math.max(1, capacity);
    this.#ttlMs = ttlMs;
    this.#keys = new Array<string | undefined>(this.#capacity).fill(undefined);
    this.#times = new Float64Array(this.#capacity);
  }

  /** The earlier answer for `key`, if one was (or is being) given. */
  get(key: string): Answer | Promise<Answer | undefined> | undefined {
    const kept = this.#kept.get(key);
    return typeof kept === "string" ? { status: 200, body: kept, code: "OK" } : kept;
  }

  /** Keeps `answer` as the one for `key` (a key not kept already). */
  set(key: string, answer: Answer | Promise<Answer | undefined>): void {
    const now = performance.now();
    while (this.#count > 0 && (this.#count === this.#capacity || now - (this.#times[this.#head] ?? 0) >= this.#ttlMs)) {
      const oldest = this.#keys[this.#head];
      if (oldest !== undefined) this.#kept.delete(oldest);
      this.#keys[this.#head] = undefined;
      this.#head = (this.#head + 1) % this.#capacity;
      this.#count -= 1;
    }
    this.#kept.set(key, Dedup.#compact(answer));
    const slot = (this.#head + this.#count) % this.#capacity;
    this.#keys[slot] = key;
    this.#times[slot] = now;
    this.#count += 1;
  }

  /** Replaces the pending answer `pending` of `key` by its value, once known. */
  replace(key: string, pending: Promise<Answer | undefined>, answer: Answer): void {
    if (this.#kept.get(key) === pending) this.#kept.set(key, Dedup.#compact(answer));
  }

  static #compact(answer: Answer | Promise<Answer | undefined>): Kept {
    return "status" in answer && answer.status === 200 && answer.code === "OK" ? answer.body : answer;
  }
}
