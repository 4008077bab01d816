/**
 * The router's hop assertion (DESIGN §8): every forwarded call carries
 * `Authorization: Bearer <JWT>` signed by the router with Ed25519 (`alg: EdDSA`), claims
 * `iss`, `sub` (the verified caller), `aud` (this instance's `agent_id`), `cap`, `tenant`,
 * `iat`, `exp`. A refusal has a `reason`: `missing`, `malformed`, `unknown_key`,
 * `bad_signature`, `wrong_issuer`, `wrong_audience`, `expired`, and, checked against the
 * envelope by the server, `source_mismatch` and `capability_mismatch`.
 *
 * Keys come from the router's JWKS (`GET {router}/.well-known/jwks.json`): fetched at
 * start, every minute, and when an assertion names an unknown `kid` (at most one fetch a
 * second, shared by every delivery waiting for it, each waiting up to 2 s), the schedule
 * of the Rust and Python SDKs; or from a JWKS file, read again when it changes.
 */

import { readFile, stat } from "node:fs/promises";

import { decodeProtectedHeader, errors as jose, importJWK, jwtVerify, type CryptoKey, type JWTPayload } from "jose";

import { log } from "./log.js";

export const DEFAULT_ISSUER = "agent-reach-router";
/** Seconds of clock skew tolerated on `exp` and `iat`. */
export const LEEWAY_S = 5;
export const INSECURE_ENV = "AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED";

export type RefusalReason =
  | "missing"
  | "malformed"
  | "unknown_key"
  | "bad_signature"
  | "wrong_issuer"
  | "wrong_audience"
  | "expired"
  | "source_mismatch"
  | "capability_mismatch";

/** A delivery's assertion is not acceptable: answered 401 `UNAUTHENTICATED` with `reason`. */
export class AssertionRefused extends Error {
  readonly reason: RefusalReason;

  constructor(reason: RefusalReason, message: string) {
    super(message);
    this.name = "AssertionRefused";
    this.reason = reason;
  }
}

/** The verified claims of one assertion. */
export interface Assertion {
  issuer: string;
  caller: string;
  audience: string;
  capability: string;
  tenant: string;
  expiresAt: number;
  /** The assertion itself: a handler's calls onwards present it upstream (`agent-reach-upstream`). */
  token: string;
  /** The delegation chain the router vouches for: the original subject first, the immediate caller last (DESIGN §9 `act`). */
  chain: readonly string[];
}

/** The names of an RFC 8693 `act` nesting (latest hop outermost), original subject first, then `caller`. */
export function chainOf(act: unknown, caller: string): string[] {
  const names: string[] = [];
  let hop = act;
  while (typeof hop === "object" && hop !== null && typeof (hop as { sub?: unknown }).sub === "string") {
    names.push((hop as { sub: string }).sub);
    hop = (hop as { act?: unknown }).act;
  }
  names.reverse();
  names.push(caller);
  return names;
}

type Keys = Map<string, CryptoKey>;

/** The Ed25519 keys of a JWKS document by `kid` (other keys skipped). */
export async function parseJwks(document: unknown, origin: string): Promise<Keys> {
  const entries = typeof document === "object" && document !== null ? (document as { keys?: unknown }).keys : undefined;
  if (!Array.isArray(entries)) throw new Error(`${origin} is not a JWKS document (expected {"keys": [...]})`);
  const keys: Keys = new Map();
  for (const entry of entries as unknown[]) {
    if (typeof entry !== "object" || entry === null) continue;
    const jwk = entry as Record<string, unknown>;
    if (jwk["kty"] !== "OKP" || jwk["crv"] !== "Ed25519" || typeof jwk["kid"] !== "string") continue;
    if ((jwk["use"] ?? "sig") !== "sig") continue;
    try {
      const key = await importJWK({ kty: "OKP", crv: "Ed25519", x: String(jwk["x"]) }, "EdDSA");
      keys.set(jwk["kid"], key);
    } catch (error) {
      throw new Error(`${origin}: key \`${jwk["kid"]}\` is not a valid Ed25519 JWK: ${String(error)}`, { cause: error });
    }
  }
  return keys;
}

/** Where verification keys come from. */
export interface KeySource {
  start(): Promise<void>;
  get(kid: string): CryptoKey | undefined;
  /** Tries to learn `kid` (rate-limited); the key, or undefined. */
  refreshFor(kid: string): Promise<CryptoKey | undefined>;
  close(): void;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms).unref());

/** Keys from a router's JWKS endpoint, cached and refreshed. */
export class JwksUrl implements KeySource {
  readonly url: string;
  #keys: Keys = new Map();
  #lastFetch = -Infinity;
  #periodic: NodeJS.Timeout | undefined;
  #asked: Promise<void> | undefined;
  readonly #refreshMs: number;
  readonly #minRefreshMs = 1000;
  readonly #waitMs = 2000;

  constructor(url: string, refreshMs = 60_000) {
    this.url = url;
    this.#refreshMs = refreshMs;
  }

  async start(): Promise<void> {
    await this.#fetch();
    this.#periodic = setInterval(() => void this.#fetch(), this.#refreshMs);
    this.#periodic.unref();
  }

  get(kid: string): CryptoKey | undefined {
    return this.#keys.get(kid);
  }

  async refreshFor(kid: string): Promise<CryptoKey | undefined> {
    const known = this.#keys.get(kid);
    if (known !== undefined) return known;
    if (this.#asked === undefined) {
      const gap = this.#lastFetch + this.#minRefreshMs - performance.now();
      if (gap > this.#waitMs) return undefined;
      this.#asked = (async () => {
        if (gap > 0) await sleep(gap);
        // From here on a delivery asking gets a fetch of its own: this one may begin before its key is published.
        this.#asked = undefined;
        await this.#fetch();
      })();
    }
    const asked = this.#asked;
    await Promise.race([asked, sleep(this.#waitMs)]);
    return this.#keys.get(kid);
  }

  close(): void {
    clearInterval(this.#periodic);
  }

  async #fetch(): Promise<void> {
    this.#lastFetch = performance.now();
    try {
      const response = await fetch(this.url, { signal: AbortSignal.timeout(5000) });
      if (!response.ok) throw new Error(`answered ${response.status}`);
      const keys = await parseJwks(await response.json(), this.url);
      if ([...keys.keys()].sort().join() !== [...this.#keys.keys()].sort().join()) {
        log.info("Router keys loaded.", { url: this.url, kids: [...keys.keys()].sort().join(",") });
      }
      this.#keys = keys;
    } catch (error) {
      // Keep the keys we have: a router restart must not make every call fail.
      log.warn("Cannot fetch the router's JWKS; keeping the known keys.", {
        url: this.url,
        known: this.#keys.size,
        error: String(error),
      });
    }
  }
}

/** Keys from a JWKS file, read at start and again when its modification time changes. */
export class JwksFile implements KeySource {
  readonly path: string;
  #keys: Keys = new Map();
  #mtime = 0;
  #lastCheck = -Infinity;

  constructor(path: string) {
    this.path = path;
  }

  async #load(): Promise<void> {
    const modified = (await stat(this.path)).mtimeMs;
    const keys = await parseJwks(JSON.parse(await readFile(this.path, "utf8")) as unknown, this.path);
    if (keys.size === 0) throw new Error(`the JWKS file ${this.path} holds no Ed25519 signing key`);
    this.#keys = keys;
    this.#mtime = modified;
  }

  async start(): Promise<void> {
    await this.#load();
  }

  get(kid: string): CryptoKey | undefined {
    return this.#keys.get(kid);
  }

  async refreshFor(kid: string): Promise<CryptoKey | undefined> {
    const now = performance.now();
    if (now - this.#lastCheck >= 1000) {
      this.#lastCheck = now;
      try {
        if ((await stat(this.path)).mtimeMs !== this.#mtime) await this.#load();
      } catch (error) {
        log.warn("Cannot reload the JWKS file; keeping the keys loaded.", { path: this.path, error: String(error) });
      }
    }
    return this.#keys.get(kid);
  }

  close(): void {
    // Nothing to stop: the file is read on demand.
  }
}

/**
 * Checks assertions for one agent instance (`audience`), keeping verified tokens for
 * their life: the router reuses an assertion for a (caller, instance, capability) while
 * half its life is left, so most deliveries skip the signature check.
 */
export class Verifier {
  static readonly CACHE_SIZE = 1024;
  readonly #source: KeySource;
  readonly #audience: string;
  readonly #issuer: string;
  readonly #verified = new Map<string, Assertion>();
  // The last header verified: the router reuses one assertion per caller, instance and
  // capability, so most deliveries compare one string instead of hashing it.
  #lastHeader: string | undefined;
  #lastAssertion: Assertion | undefined;

  constructor(source: KeySource, audience: string, issuer = DEFAULT_ISSUER) {
    this.#source = source;
    this.#audience = audience;
    this.#issuer = issuer;
  }

  /** The assertion of an `Authorization` header value verified before and still valid (no await: the hot path). */
  cached(authorization: string | undefined): Assertion | undefined {
    if (authorization === undefined) return undefined;
    let cached: Assertion | undefined;
    if (authorization === this.#lastHeader) cached = this.#lastAssertion;
    else {
      cached = this.#verified.get(authorization);
      if (cached !== undefined) {
        this.#lastHeader = authorization;
        this.#lastAssertion = cached;
      }
    }
    return cached !== undefined && cached.expiresAt + LEEWAY_S > Date.now() / 1000 ? cached : undefined;
  }

  /** The assertion in an `Authorization` header value, or {@link AssertionRefused}. */
  async verify(authorization: string | undefined): Promise<Assertion> {
    if (authorization === undefined || authorization === "") {
      throw new AssertionRefused("missing", "missing router assertion: expected `Authorization: Bearer <JWT>`");
    }
    const space = authorization.indexOf(" ");
    const token = space < 0 ? "" : authorization.slice(space + 1).trim();
    if (space < 0 || authorization.slice(0, space).toLowerCase() !== "bearer" || token === "") {
      throw new AssertionRefused("malformed", "the Authorization header is not `Bearer <JWT>`");
    }
    const now = Date.now() / 1000;
    const cached = this.#verified.get(authorization);
    if (cached !== undefined) {
      if (cached.expiresAt + LEEWAY_S > now) return cached;
      this.#verified.delete(authorization);
    }
    const assertion = await this.#verify(token, now);
    this.#verified.set(authorization, assertion);
    if (this.#verified.size > Verifier.CACHE_SIZE) {
      const oldest = this.#verified.keys().next();
      if (oldest.done !== true) this.#verified.delete(oldest.value);
    }
    return assertion;
  }

  async #verify(token: string, now: number): Promise<Assertion> {
    let kid: unknown;
    try {
      const header = decodeProtectedHeader(token);
      if (header.alg !== "EdDSA") {
        throw new AssertionRefused("malformed", `the assertion's alg is ${String(header.alg)}; only EdDSA is accepted`);
      }
      kid = header.kid;
    } catch (error) {
      if (error instanceof AssertionRefused) throw error;
      throw new AssertionRefused("malformed", "the assertion is not a JWT");
    }
    if (typeof kid !== "string" || kid === "") throw new AssertionRefused("malformed", "the assertion names no key (`kid`)");
    const key = this.#source.get(kid) ?? (await this.#source.refreshFor(kid));
    if (key === undefined) {
      throw new AssertionRefused("unknown_key", `the assertion is signed with key \`${kid}\`, which the router's keys do not list`);
    }
    let claims: JWTPayload;
    try {
      // Time claims are checked below, so each failure gets its own reason.
      claims = (await jwtVerify(token, key, { algorithms: ["EdDSA"], currentDate: new Date(0) })).payload;
    } catch (error) {
      if (error instanceof jose.JWSSignatureVerificationFailed) {
        throw new AssertionRefused("bad_signature", "the assertion's signature does not verify with the router's key");
      }
      throw new AssertionRefused("malformed", `the assertion cannot be decoded: ${String(error)}`);
    }
    const { iss, sub, aud, exp, iat } = claims;
    const cap = claims["cap"];
    if (typeof iss !== "string" || typeof sub !== "string" || typeof cap !== "string" || aud === undefined) {
      throw new AssertionRefused("malformed", "the assertion needs `iss`, `sub`, `aud` and `cap` claims");
    }
    if (typeof exp !== "number" || typeof iat !== "number") {
      throw new AssertionRefused("malformed", "the assertion's `exp` and `iat` must be numbers");
    }
    if (iss !== this.#issuer) throw new AssertionRefused("wrong_issuer", `the assertion was issued by ${iss}, not ${this.#issuer}`);
    const audiences = Array.isArray(aud) ? aud : [aud];
    if (!audiences.includes(this.#audience)) {
      throw new AssertionRefused("wrong_audience", `the assertion is for ${audiences.join(",")}, not for this agent (${this.#audience})`);
    }
    if (exp + LEEWAY_S <= now) throw new AssertionRefused("expired", "the assertion has expired");
    if (iat - LEEWAY_S > now) throw new AssertionRefused("malformed", "the assertion was issued in the future (check the clocks)");
    const tenant = claims["tenant"];
    return {
      issuer: iss,
      caller: sub,
      audience: this.#audience,
      capability: cap,
      tenant: typeof tenant === "string" ? tenant : "default",
      expiresAt: exp,
      token,
      chain: chainOf(claims["act"], sub),
    };
  }
}

export function insecureFromEnv(): boolean {
  return ["1", "true", "yes", "on"].includes((process.env[INSECURE_ENV] ?? "").trim().toLowerCase());
}
