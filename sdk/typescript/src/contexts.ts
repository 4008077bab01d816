/**
 * The context service's HTTP API (DESIGN §4): versioned, access-controlled session
 * context. {@link Contexts} is the raw API (a {@link Client}'s `contexts`);
 * {@link ContextHandle} is the one context a delivery names (`ctx.context`).
 */

import { ContextError } from "./errors.js";
import { count, isObject, jsonHeaders, send, serviceAnswer, text } from "./wire.js";

export type Tier = "default" | "one_shot";

/** A context as read: the fields the reader may see, and the version to patch against. */
export interface ContextView {
  contextId: string;
  version: number;
  tier: string;
  expiresAtMs: number;
  fields: Record<string, unknown>;
}

export interface Patch {
  set?: Record<string, unknown>;
  delete?: string[];
  /** Apply only at this version, else {@link VersionConflict}. */
  ifVersion?: number;
}

export interface CreateOptions {
  fields?: Record<string, unknown>;
  tier?: Tier;
  contextId?: string;
}

function view(body: unknown, fields?: Record<string, unknown>): ContextView {
  const answer = isObject(body) ? body : {};
  const read = answer["fields"];
  return {
    contextId: text(answer["context_id"]),
    version: count(answer["version"]),
    tier: text(answer["tier"]),
    expiresAtMs: count(answer["expires_at"]),
    fields: fields ?? (isObject(read) ? read : {}),
  };
}

/** `/v1/contexts` on one context service, as the holder of `token`. */
export class Contexts {
  readonly #url: string;
  readonly #token: string;

  constructor(url: string, token: string) {
    this.#url = url.replace(/\/+$/, "");
    this.#token = token;
  }

  async #send(method: string, path: string, body?: unknown): Promise<unknown> {
    const response = await send("context", `${this.#url}${path}`, {
      method,
      headers: jsonHeaders(this.#token),
      body: body === undefined ? null : JSON.stringify(body),
      timeoutMs: 10_000,
    });
    return serviceAnswer(response, "context");
  }

  /** Creates a context (tier `default` or `one_shot`). */
  async create(options: CreateOptions = {}): Promise<ContextView> {
    const body: Record<string, unknown> = {};
    if (options.contextId !== undefined) body["context_id"] = options.contextId;
    if (options.tier !== undefined) body["tier"] = options.tier;
    if (options.fields !== undefined) body["fields"] = options.fields;
    return view(await this.#send("POST", "/v1/contexts", body), options.fields ?? {});
  }

  /** Reads `fields` (every field the caller may read when absent). */
  async get(contextId: string, fields?: string[]): Promise<ContextView> {
    const query = fields === undefined || fields.length === 0 ? "" : `?fields=${encodeURIComponent(fields.join(","))}`;
    return view(await this.#send("GET", `/v1/contexts/${encodeURIComponent(contextId)}${query}`));
  }

  /** Sets and deletes fields at once; returns the new version. */
  async patch(contextId: string, patch: Patch): Promise<number> {
    const body: Record<string, unknown> = {};
    if (patch.set !== undefined) body["set"] = patch.set;
    if (patch.delete !== undefined) body["delete"] = patch.delete;
    if (patch.ifVersion !== undefined) body["if_version"] = patch.ifVersion;
    const answer = await this.#send("PATCH", `/v1/contexts/${encodeURIComponent(contextId)}`, body);
    return isObject(answer) ? count(answer["version"]) : 0;
  }

  /** Deletes the context at once (its creator, or an agent with `write: ["*"]`). */
  async close(contextId: string): Promise<void> {
    await this.#send("DELETE", `/v1/contexts/${encodeURIComponent(contextId)}`);
  }
}

/** The session context a delivery names (`context_id`), as its handler sees it. */
export class ContextHandle {
  readonly contextId: string | undefined;
  readonly #contexts: Contexts | undefined;

  constructor(contexts: Contexts | undefined, contextId: string | undefined) {
    this.#contexts = contexts;
    this.contextId = contextId;
  }

  #parts(): [Contexts, string] {
    if (this.#contexts === undefined) {
      throw new ContextError("NO_CONTEXT_SERVICE", "this agent was built without a context service URL (`context`)");
    }
    if (this.contextId === undefined) throw new ContextError("NO_CONTEXT", "this request carries no context_id");
    return [this.#contexts, this.contextId];
  }

  get(fields?: string[]): Promise<ContextView> {
    const [contexts, id] = this.#parts();
    return contexts.get(id, fields);
  }

  patch(patch: Patch): Promise<number> {
    const [contexts, id] = this.#parts();
    return contexts.patch(id, patch);
  }

  close(): Promise<void> {
    const [contexts, id] = this.#parts();
    return contexts.close(id);
  }
}
