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

interface Slot {
  at: number;
  key: string;
  answer: Answer | Promise<Answer | undefined>;
}

export class Dedup {
  readonly #capacity: number;
  readonly #ttlMs: number;
  readonly #slots = new Map<string, Slot>();
  // The ids oldest first, in an array with a moving head rather than in the Map's own
  // order: a Map whose oldest entries keep being deleted walks over their holes on every
  // iteration from the start (the bench showed it), a queue does not.
  #order: Slot[] = [];
  #head = 0;

  constructor(capacity = 10_000, ttlMs = 600_000) {
    this.#capacity = Math.max(1, capacity);
    this.#ttlMs = ttlMs;
  }

  /** The earlier answer for `key`, if one was (or is being) given. */
  get(key: string): Answer | Promise<Answer | undefined> | undefined {
    return this.#slots.get(key)?.answer;
  }

  /** Keeps `answer` as the one for `key`. */
  set(key: string, answer: Answer | Promise<Answer | undefined>): void {
    const now = performance.now();
    const order = this.#order;
    while (this.#head < order.length) {
      const oldest = order[this.#head];
      if (oldest === undefined || (this.#slots.size < this.#capacity && now - oldest.at < this.#ttlMs)) break;
      // Only if the id is still that entry's (a forgotten id may have come back since).
      if (this.#slots.get(oldest.key) === oldest) this.#slots.delete(oldest.key);
      this.#head += 1;
    }
    if (this.#head > 1024 && this.#head * 2 > order.length) {
      this.#order = order.slice(this.#head);
      this.#head = 0;
    }
    const slot = { at: now, key, answer };
    this.#slots.set(key, slot);
    this.#order.push(slot);
  }

  /** Replaces the pending answer `pending` of `key` by its value, once known. */
  replace(key: string, pending: Promise<Answer | undefined>, answer: Answer): void {
    const slot = this.#slots.get(key);
    if (slot?.answer === pending) slot.answer = answer;
  }

  /** Forgets `key`: its delivery ended without an answer worth repeating (its queue entry goes when it comes up). */
  forget(key: string): void {
    this.#slots.delete(key);
  }
}
