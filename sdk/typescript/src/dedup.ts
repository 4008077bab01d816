/**
 * Deduplication by request id (DESIGN §3.5): a repeat gets the first answer, a
 * concurrent repeat waits for it. Bounded in size and age (10,000 ids, 10 minutes), as
 * the Rust and Python SDKs.
 */

/** A finished answer: HTTP status, JSON body, and its code (`OK` or the error's). */
export interface Answer {
  status: number;
  body: string;
  code: string;
}

export class Dedup {
  readonly #capacity: number;
  readonly #ttlMs: number;
  // Insertion order is age order; a forgotten id that comes back is re-inserted at the end.
  readonly #slots = new Map<string, { at: number; answer: Promise<Answer> }>();

  constructor(capacity = 10_000, ttlMs = 600_000) {
    this.#capacity = Math.max(1, capacity);
    this.#ttlMs = ttlMs;
  }

  /** The earlier answer for `key`, if one was (or is being) given. */
  get(key: string): Promise<Answer> | undefined {
    return this.#slots.get(key)?.answer;
  }

  /** Keeps `answer` as the one for `key`. */
  set(key: string, answer: Promise<Answer>): void {
    const now = performance.now();
    for (const [oldest, slot] of this.#slots) {
      if (this.#slots.size < this.#capacity && now - slot.at < this.#ttlMs) break;
      this.#slots.delete(oldest);
    }
    this.#slots.set(key, { at: now, answer });
  }

  /** Forgets `key`: its delivery ended without an answer worth repeating. */
  forget(key: string): void {
    this.#slots.delete(key);
  }
}
