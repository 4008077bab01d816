/**
 * An agent: its handlers, identity and links, and its life: serve, register, heartbeat,
 * re-register, drain, deregister.
 *
 * ```ts
 * const agent = new Agent({ name: "summarizer", endpoint: "http://summarizer-1.internal:8000", listen: "0.0.0.0:8000" });
 * agent.handler({ capability: "text.summarize", input: Text, output: Summary }, async ({ text }) => ({ summary: text }));
 * await agent.run(); // registers, marks ready, serves; SIGTERM drains and deregisters
 * ```
 *
 * Drain (SIGTERM, SIGINT or `stop()`): report `draining` at once (routers stop sending
 * work; deliveries still arriving get 503, retried elsewhere), wait for in-flight work
 * (`drainTimeoutMs`, 30 s), deregister, stop serving.
 */

import { randomBytes } from "node:crypto";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";

import type { z } from "zod";

import { requestAccess, type AccessRequest, type AccessRequestOptions } from "./access.js";
import { DEFAULT_ISSUER, INSECURE_ENV, JwksFile, JwksUrl, Verifier, insecureFromEnv, type KeySource } from "./assertion.js";
import { Contexts } from "./contexts.js";
import type { Links } from "./ctx.js";
import { ConfigError, HandlerDefinitionError } from "./errors.js";
import {
  defineHandler,
  defineStreaming,
  type Handler,
  type HandlerFunction,
  type HandlerSpec,
  type StreamingFunction,
  type StreamingSpec,
} from "./handler.js";
import { Lifecycle } from "./lifecycle.js";
import { log } from "./log.js";
import { agentServer } from "./server.js";
import { AgentState } from "./state.js";
import { loadTelemetry } from "./telemetry.js";
import { DEFAULT_THRESHOLDS, StatusTracker, type Load, type LoadThresholds, type Status } from "./status.js";

export interface AgentOptions {
  /** The agent's identity: its token's `sub`, the ACL's name. */
  name: string;
  /** This running instance (default `NAME-xxxx`). */
  agentId?: string;
  /** The externally reachable base URL the router calls (`{endpoint}/invoke`); default `$AGENT_REACH_ENDPOINT`, else the bound address. */
  endpoint?: string;
  /** `HOST:PORT` to serve on; default `$AGENT_REACH_LISTEN`, else `127.0.0.1:0` (a free port). */
  listen?: string;
  /** Registry URLs (a list, or comma separated); default `$AGENT_REACH_REGISTRY`. One is used at a time. */
  registry?: string | string[];
  /** The router: calls onwards, and its JWKS; default `$AGENT_REACH_ROUTER`. */
  router?: string;
  /** The context service; default `$AGENT_REACH_CONTEXT`. */
  context?: string;
  /** A JWT whose `sub` is `name`; default `$AGENT_REACH_TOKEN`. */
  token?: string;
  weight?: number;
  ttlS?: number;
  tags?: Record<string, string>;
  /** Deliveries at once; beyond, 503 `OVERLOADED` (the router tries elsewhere). Default 256. */
  maxConcurrency?: number;
  loadThresholds?: LoadThresholds;
  drainTimeoutMs?: number;
  maxBodyBytes?: number;
  /** Where the router's keys are: default `{router}/.well-known/jwks.json`. */
  jwksUrl?: string;
  /** Or a JWKS file, re-read when it changes. */
  jwksFile?: string;
  /** The assertions' expected `iss`. */
  issuer?: string;
  /** Development only: accept calls without a valid router assertion (or `AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED=1`). */
  insecureAcceptUnverified?: boolean;
}

interface Running {
  state: AgentState;
  lifecycle: Lifecycle;
  server: Server;
  source: KeySource | undefined;
}

function env(name: string): string | undefined {
  const value = process.env[name];
  return value === undefined || value.trim() === "" ? undefined : value.trim();
}

function registriesOf(value: string | string[] | undefined): string[] {
  const parts = value === undefined ? [] : Array.isArray(value) ? value : value.split(",");
  return parts.map((part) => part.trim().replace(/\/+$/, "")).filter((part) => part !== "");
}

function isHttpUrl(value: string): boolean {
  try {
    const protocol = new URL(value).protocol;
    return protocol === "http:" || protocol === "https:";
  } catch {
    return false;
  }
}

export class Agent {
  readonly name: string;
  readonly agentId: string;
  readonly handlers: Handler[] = [];
  readonly #options: AgentOptions;
  #running: Running | undefined;
  #starting: Promise<void> | undefined;
  #stopped: Promise<void> | undefined;
  #pendingReady = false;
  #pendingLoad: Load | undefined;
  #signals: (() => void) | undefined;

  constructor(options: AgentOptions) {
    this.#options = options;
    this.name = options.name;
    this.agentId = options.agentId ?? `${options.name}-${randomBytes(2).toString("hex")}`;
  }

  // === Declaring ===

  #add(handler: Handler): void {
    const { name, version } = handler.descriptor;
    if (this.#running !== undefined || this.#starting !== undefined) {
      throw new HandlerDefinitionError(name, "the agent has started; declare handlers before");
    }
    if (this.handlers.some((existing) => existing.descriptor.name === name && existing.descriptor.version === version)) {
      throw new HandlerDefinitionError(name, `${version} is already handled`);
    }
    this.handlers.push(handler);
  }

  /**
   * Declares the handler of `spec.capability`: `input` and `output` are zod types, whose
   * JSON Schemas are registered and which validate what arrives and what is answered.
   */
  handler<I extends z.ZodType, O extends z.ZodType>(spec: HandlerSpec<I, O>, fn: HandlerFunction<I, O>): this {
    this.#add(defineHandler(spec, fn));
    return this;
  }

  /**
   * Declares a streaming handler, an async generator yielding `item`s: a caller asking
   * for `text/event-stream` gets each as one event as it is produced; any other caller
   * gets them collected as an array (the registered output schema).
   */
  streaming<I extends z.ZodType, T extends z.ZodType>(spec: StreamingSpec<I, T>, fn: StreamingFunction<I, T>): this {
    this.#add(defineStreaming(spec, fn));
    return this;
  }

  // === State ===

  get status(): Status {
    return this.#running?.state.currentStatus() ?? "starting";
  }

  get inflight(): number {
    return this.#running?.state.inflight ?? 0;
  }

  /** The address served on, once started. */
  get address(): AddressInfo | undefined {
    const address = this.#running?.server.address();
    return typeof address === "object" && address !== null ? address : undefined;
  }

  /** Accept traffic: the agent's own initialisation is done. Until then it is `starting` and gets none. */
  markReady(): void {
    const state = this.#running?.state;
    if (state === undefined) {
      this.#pendingReady = true;
      return;
    }
    if (state.status.phase === "starting") {
      state.status.phase = "ready";
      state.noteStatus();
    }
  }

  /**
   * Reports load the SDK cannot see (a GPU queue, a rate-limited upstream): `"busy"` or
   * `"overloaded"`; `undefined` leaves it to the in-flight thresholds again. The heavier wins.
   */
  reportLoad(load: Load | undefined): void {
    const state = this.#running?.state;
    if (state === undefined) {
      this.#pendingLoad = load;
      return;
    }
    state.status.reported = load;
    state.noteStatus();
  }

  // === Access ===

  /**
   * Asks to call `capability` as this agent (`POST /v1/access-requests` on its registry),
   * with `reason` for the approvers acl.yaml's `owners:` names; once approved the grant lasts
   * `ttlS` seconds (absent: until revoked). Safe at every start: a request still pending is
   * answered again, not filed twice; `{status: "allowed"}` once it may call. Throws
   * `RegistryError` with the registry's code (`CAPABILITY_NOT_FOUND`: no agent offers it
   * yet; `NO_OWNER`: no one could approve it).
   */
  requestAccess(capability: string, reason: string, options: AccessRequestOptions = {}): Promise<AccessRequest> {
    const o = this.#options;
    const registries = registriesOf(o.registry ?? env("AGENT_REACH_REGISTRY"));
    return requestAccess(registries, o.token ?? env("AGENT_REACH_TOKEN") ?? "", capability, reason, options);
  }

  // === Running ===

  /** {@link Agent.start}, {@link Agent.markReady}, then {@link Agent.runUntilSignal}. */
  async run(): Promise<void> {
    await this.start();
    this.markReady();
    await this.runUntilSignal();
  }

  /** Resolves once SIGTERM or SIGINT arrived and the agent drained and stopped (or {@link Agent.stop} did it). */
  async runUntilSignal(): Promise<void> {
    if (this.#running === undefined) throw new Error("start() the agent first");
    const stop = (): void => void this.stop();
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
    this.#signals = () => {
      process.off("SIGTERM", stop);
      process.off("SIGINT", stop);
    };
    const stopped = new Promise<void>((resolve) => (this.#onStopped = resolve));
    await stopped;
  }

  #onStopped: (() => void) | undefined;

  #problems(): string[] {
    const o = this.#options;
    const problems: string[] = [];
    if (this.name === "") problems.push("name is empty");
    if (this.handlers.length === 0) problems.push("no handler: declare one with agent.handler(...)");
    const registries = registriesOf(o.registry ?? env("AGENT_REACH_REGISTRY"));
    if (registries.length === 0) problems.push("no registry URL: pass registry or set AGENT_REACH_REGISTRY");
    for (const url of registries) if (!isHttpUrl(url)) problems.push(`registry must be an http(s):// URL, not \`${url}\``);
    if ((o.token ?? env("AGENT_REACH_TOKEN")) === undefined) {
      problems.push("no token: pass token (a JWT whose sub is the agent name) or set AGENT_REACH_TOKEN");
    }
    const weight = o.weight ?? 1;
    if (!Number.isInteger(weight) || weight < 1 || weight > 1000) problems.push(`weight must be 1..=1000, not ${weight}`);
    if ((o.maxConcurrency ?? 256) < 1) problems.push("maxConcurrency must be at least 1");
    const thresholds = o.loadThresholds ?? DEFAULT_THRESHOLDS;
    if (!(thresholds.busy > 0 && thresholds.busy <= thresholds.overloaded && thresholds.overloaded <= 1)) {
      problems.push(`load thresholds need 0 < busy (${thresholds.busy}) <= overloaded (${thresholds.overloaded}) <= 1`);
    }
    const endpoint = o.endpoint ?? env("AGENT_REACH_ENDPOINT");
    if (endpoint !== undefined && !isHttpUrl(endpoint)) problems.push(`endpoint must be an http(s):// URL, not \`${endpoint}\``);
    const router = o.router ?? env("AGENT_REACH_ROUTER");
    if (!this.#insecure() && o.jwksFile === undefined && o.jwksUrl === undefined && router === undefined) {
      problems.push(
        `verifying the router's assertions needs its keys: pass router (its JWKS), jwksUrl or jwksFile, or, for development only, insecureAcceptUnverified (${INSECURE_ENV}=1)`,
      );
    }
    return problems;
  }

  #insecure(): boolean {
    return this.#options.insecureAcceptUnverified === true || insecureFromEnv();
  }

  /**
   * Serves and registers (as `starting`) and returns; call {@link Agent.markReady} once
   * the agent's own initialisation is done. Throws {@link ConfigError} listing every
   * problem, or {@link RegistrationRefused} when the registry refuses the registration.
   */
  async start(): Promise<void> {
    if (this.#running !== undefined || this.#starting !== undefined) throw new Error("the agent is already running");
    const starting = this.#start();
    this.#starting = starting;
    try {
      await starting;
    } finally {
      this.#starting = undefined;
    }
  }

  async #start(): Promise<void> {
    const problems = this.#problems();
    if (problems.length > 0) throw new ConfigError(problems);
    await loadTelemetry();
    const o = this.#options;
    const router = (o.router ?? env("AGENT_REACH_ROUTER"))?.replace(/\/+$/, "");
    const contextUrl = o.context ?? env("AGENT_REACH_CONTEXT");
    const token = o.token ?? env("AGENT_REACH_TOKEN") ?? "";
    const maxConcurrency = o.maxConcurrency ?? 256;
    let source: KeySource | undefined;
    if (!this.#insecure()) {
      source = o.jwksFile !== undefined ? new JwksFile(o.jwksFile) : new JwksUrl(o.jwksUrl ?? `${router ?? ""}/.well-known/jwks.json`);
    }
    const links: Links = {
      router,
      contexts: contextUrl === undefined ? undefined : new Contexts(contextUrl, token),
      token,
      background: new Set(),
    };
    const state = new AgentState({
      agentId: this.agentId,
      handlers: this.handlers,
      links,
      verifier: source === undefined ? undefined : new Verifier(source, this.agentId, o.issuer ?? DEFAULT_ISSUER),
      maxConcurrency,
      maxBodyBytes: o.maxBodyBytes ?? 1024 * 1024,
      ttlS: o.ttlS ?? 15,
      status: new StatusTracker(maxConcurrency, o.loadThresholds ?? DEFAULT_THRESHOLDS),
    });
    if (this.#pendingReady) state.status.phase = "ready";
    state.status.reported = this.#pendingLoad;

    const server = agentServer(() => (this.#running?.state === state ? state : undefined));
    const [host, port] = this.#listenOn(o.listen ?? env("AGENT_REACH_LISTEN") ?? "127.0.0.1:0");
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen({ host, port, backlog: 1024 }, () => {
        server.off("error", reject);
        resolve();
      });
    });
    const bound = server.address() as AddressInfo;
    const shown = bound.family === "IPv6" ? `[${bound.address}]` : bound.address;
    const endpoint = (o.endpoint ?? env("AGENT_REACH_ENDPOINT") ?? `http://${shown}:${bound.port}`).replace(/\/+$/, "");
    warnAboutEndpoint(endpoint);
    if (source === undefined) {
      log.warn(
        `ROUTER ASSERTIONS ARE NOT VERIFIED (insecureAcceptUnverified / ${INSECURE_ENV}): anyone who can reach ${endpoint} can call this agent as anyone. Development only.`,
      );
    }
    const lifecycle = new Lifecycle(state, registriesOf(o.registry ?? env("AGENT_REACH_REGISTRY")), token, {
      agentId: this.agentId,
      name: this.name,
      endpoint: `${endpoint}/invoke`,
      weight: o.weight ?? 1,
      ttlS: o.ttlS ?? 15,
      tags: o.tags,
      capabilities: this.handlers.map((handler) => handler.descriptor),
    });
    this.#running = { state, lifecycle, server, source };
    try {
      await source?.start();
      await lifecycle.start();
    } catch (error) {
      this.#running = undefined;
      source?.close();
      await closeServer(server);
      throw error;
    }
    this.#stopped = undefined;
  }

  #listenOn(listen: string): [string, number] {
    const colon = listen.lastIndexOf(":");
    const host = listen.slice(0, colon).replace(/^\[|\]$/g, "") || "0.0.0.0";
    const port = Number(listen.slice(colon + 1));
    if (colon < 0 || !Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError([`listen must be HOST:PORT, not \`${listen}\``]);
    return [host, port];
  }

  /** Drains and stops: `draining` → in-flight work ends (bounded) → deregistered → the server closes. */
  stop(): Promise<void> {
    this.#stopped ??= this.#stop();
    return this.#stopped;
  }

  async #stop(): Promise<void> {
    const running = this.#running;
    if (running === undefined) return;
    const { state, lifecycle, server, source } = running;
    state.status.phase = "draining";
    state.noteStatus();
    log.info("Draining.", { agent_id: this.agentId, inflight: state.inflight });
    await lifecycle.announceDraining();
    const timeoutMs = this.#options.drainTimeoutMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const drained = await Promise.race([
      Promise.all([state.idle(), Promise.allSettled([...state.links.background])]).then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => { resolve(false); }, timeoutMs))),
    ]);
    clearTimeout(timer);
    if (drained) log.info("Drained: no delivery in flight.", { agent_id: this.agentId });
    else log.warn("Drain timeout: deregistering with work in flight.", { inflight: state.inflight });
    await lifecycle.stop();
    await lifecycle.deregister();
    source?.close();
    await closeServer(server);
    this.#running = undefined;
    this.#signals?.();
    this.#signals = undefined;
    this.#onStopped?.();
    this.#onStopped = undefined;
  }
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => { resolve(); });
    server.closeIdleConnections();
  });
}

/** Loud warnings for endpoints the router usually cannot reach (DESIGN §2.1). */
function warnAboutEndpoint(endpoint: string): void {
  const host = new URL(endpoint).hostname.replace(/^\[|\]$/g, "");
  if (host === "0.0.0.0" || host === "::") {
    log.warn(`ENDPOINT ${endpoint} IS NOT AN ADDRESS ANYONE CAN CALL: set endpoint to the URL the router reaches.`);
  } else if (host === "localhost" || host.startsWith("127.") || host === "::1") {
    log.warn(`Endpoint ${endpoint} is a loopback address: only a router on this host can reach it. Set endpoint in production.`);
  } else if (host.startsWith("172.17.")) {
    log.warn(`Endpoint ${endpoint} looks like a container-internal address (Docker's bridge): set endpoint to the published URL.`);
  }
}
