/**
 * Test support: real etcd, Redis and the real `agent-reach` registry, router (tasks on)
 * and context service, on free loopback ports in a temporary directory, every process
 * killed by `stop()` (the TypeScript counterpart of `sdk/python/tests/support/stack.py`).
 *
 * Waiting is polling a condition with a bound ({@link waitUntil}), never a bare sleep.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { createHmac, generateKeyPairSync, randomBytes, type KeyObject } from "node:crypto";
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SignJWT, calculateJwkThumbprint, exportJWK } from "jose";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file runs from sdk/typescript/build/test/support). */
export const REPO = resolve(HERE, "../../../../..");
const START_TIMEOUT_MS = 30_000;

/** A fresh temporary directory, removed when this process exits if not before. */
export function temporaryDirectory(prefix: string): string {
  const directory = mkdtempSync(join(tmpdir(), prefix));
  directories.add(directory);
  return directory;
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => {
        done(port);
      });
    });
  });
}

const pause = (ms: number): Promise<void> => new Promise((done) => setTimeout(done, ms));

/** Polls `condition` until it holds; throws naming `what` after `timeoutMs`. */
export async function waitUntil(condition: () => boolean | Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      if (await condition()) return;
    } catch {
      // Not yet (connection refused, ...).
    }
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await pause(20);
  }
}

function findBinary(name: string, debianPackage: string): string {
  for (const directory of (process.env["PATH"] ?? "").split(":").concat(["/usr/bin", "/usr/sbin", "/usr/local/bin"])) {
    const candidate = join(directory, name);
    if (directory !== "" && existsSync(candidate)) return candidate;
  }
  throw new Error(`\`${name}\` not found: install the Debian package \`${debianPackage}\` (scripts/setup.sh does)`);
}

/** A binary of this workspace: in `$AGENT_REACH_BIN_DIR` when set (the bench: a release build), else the debug build. */
export function cargoBinary(name: string, cratePackage: string): string {
  const directory = process.env["AGENT_REACH_BIN_DIR"] ?? join(process.env["CARGO_TARGET_DIR"] ?? join(REPO, "target"), "debug");
  const path = join(directory, name);
  if (!existsSync(path)) throw new Error(`${path} is missing: run \`cargo build -p ${cratePackage}\``);
  return path;
}

/** Every child still running: killed when this process exits however it exits (a failed test, ^C). */
const running = new Set<ChildProcess>();
/** Every temporary directory not removed yet: removed at exit too. */
const directories = new Set<string>();
process.once("exit", () => {
  for (const child of running) child.kill("SIGKILL");
  for (const directory of directories) rmSync(directory, { recursive: true, force: true });
});
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    process.exit(130);
  });
}

/** A child process with its output in a log file; `stop()` kills it and waits until it is gone. */
export class Process {
  readonly child: ChildProcess;
  readonly log: string;
  readonly #exited: Promise<number | null>;

  constructor(argv: string[], log: string, env: Record<string, string> = {}) {
    this.log = log;
    const out = createWriteStream(log, { flags: "a" });
    const [command = "", ...args] = argv;
    this.child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    this.child.stdout?.pipe(out);
    this.child.stderr?.pipe(out);
    running.add(this.child);
    this.#exited = new Promise((done) =>
      this.child.once("exit", (code) => {
        running.delete(this.child);
        done(code);
      }),
    );
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  tail(lines = 30): string {
    try {
      return readFileSync(this.log, "utf8").split("\n").slice(-lines).join("\n");
    } catch {
      return "";
    }
  }

  /** The exit code, once it exited (bounded). */
  async exited(timeoutMs: number): Promise<number | null> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((done) => (timer = setTimeout(() => {
      done("late");
    }, timeoutMs)));
    const outcome = await Promise.race([this.#exited, late]);
    clearTimeout(timer);
    if (outcome === "late") throw new Error(`${this.log}: still running after ${timeoutMs} ms`);
    return outcome;
  }

  async stop(): Promise<void> {
    if (this.alive) this.child.kill("SIGKILL");
    await this.#exited;
  }
}

async function started(process: Process, ready: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    if (!process.alive) throw new Error(`${what} exited during start-up:\n${process.tail()}`);
    try {
      if (await ready()) return;
    } catch {
      // Not listening yet.
    }
    if (Date.now() >= deadline) {
      await process.stop();
      throw new Error(`${what} did not become ready in ${START_TIMEOUT_MS} ms:\n${process.tail()}`);
    }
    await pause(20);
  }
}

async function ok(url: string): Promise<boolean> {
  const response = await fetch(url, { signal: AbortSignal.timeout(1000) });
  await response.arrayBuffer();
  return response.ok;
}

function pong(port: number): Promise<boolean> {
  return new Promise((done) => {
    const socket = connect(port, "127.0.0.1", () => socket.write("PING\r\n"));
    socket.setTimeout(500, () => {
      socket.destroy();
      done(false);
    });
    socket.once("data", (data) => {
      socket.destroy();
      done(data.toString().startsWith("+PONG"));
    });
    socket.once("error", () => {
      done(false);
    });
  });
}

export const ACL = `version: 1
permissions:
  - caller: tester
    allow: ["*"]
  - caller: ts_agent
    allow: ["*"]
  - caller: ts_alice
    allow: ["test.chain.*"]
  - caller: ts_bob
    allow: [test.chain.first]
  - caller: ts_first
    allow: [test.chain.middle]
    subjects: [ts_alice]
  - caller: ts_middle
    allow: [test.chain.last]
    via: [ts_first]
providers:
  - agent: "*"
    provides: ["test.*", "text.*"]
owners:
  - capability: test.asked
    approvers: [owner]
context:
  - agent: tester
    read: ["*"]
    write: ["*"]
  - agent: ts_agent
    read: ["*"]
    write: ["*"]
`;

/** One `agent-reach SERVICE` process, ready when its `/readyz` answers 200. */
export class Service {
  readonly kind: string;
  readonly port: number;
  process: Process | undefined;

  private constructor(kind: string, port: number) {
    this.kind = kind;
    this.port = port;
  }

  static async start(kind: string, args: string[], directory: string): Promise<Service> {
    const service = new Service(kind, await freePort());
    const binary = cargoBinary("agent-reach", "agent-reach-cli");
    const argv = [binary, "--log-format", "json", kind, "--listen", `127.0.0.1:${service.port}`, ...args];
    service.process = new Process(argv, join(directory, `${kind}-${service.port}.log`));
    await started(service.process, () => ok(`${service.url}/readyz`), kind);
    return service;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async stop(): Promise<void> {
    await this.process?.stop();
  }
}

function b64url(data: Buffer | string): string {
  return Buffer.from(data).toString("base64url");
}

/** etcd + Redis + registry + router (tasks on) + context service, authentication on (HS256). */
export class Stack {
  readonly directory: string;
  readonly secret: string;
  /** The router's assertion key: tests that post straight to an agent sign their own assertions with it. */
  readonly routerKey: KeyObject;
  routerKid = "";
  etcdUrl = "";
  registry!: Service;
  router!: Service;
  context!: Service;
  readonly #parts: { stop(): Promise<void> }[] = [];

  private constructor() {
    this.directory = temporaryDirectory("agent-reach-ts-");
    this.secret = randomBytes(32).toString("hex");
    this.routerKey = generateKeyPairSync("ed25519").privateKey;
  }

  static async start(): Promise<Stack> {
    const stack = new Stack();
    try {
      await stack.#start();
    } catch (error) {
      await stack.stop();
      throw error;
    }
    return stack;
  }

  async #start(): Promise<void> {
    const dir = this.directory;
    writeFileSync(join(dir, "hs256.secret"), this.secret);
    writeFileSync(join(dir, "callback.secret"), randomBytes(32).toString("hex"));
    writeFileSync(join(dir, "assertion.pem"), this.routerKey.export({ format: "pem", type: "pkcs8" }));
    writeFileSync(join(dir, "acl.yaml"), ACL);
    this.routerKid = await calculateJwkThumbprint(await exportJWK(this.routerKey));

    const etcd = findBinary("etcd", "etcd-server");
    const [client, peer] = [await freePort(), await freePort()];
    this.etcdUrl = `http://127.0.0.1:${client}`;
    const etcdProcess = new Process(
      [
        etcd,
        "--name=ts",
        `--data-dir=${join(dir, "etcd")}`,
        `--listen-client-urls=${this.etcdUrl}`,
        `--advertise-client-urls=${this.etcdUrl}`,
        `--listen-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-cluster=ts=http://127.0.0.1:${peer}`,
        "--initial-cluster-state=new",
        "--log-level=warn",
        "--heartbeat-interval=50",
        "--election-timeout=500",
      ],
      join(dir, "etcd.log"),
      { ETCD_UNSUPPORTED_ARCH: process.arch === "arm64" ? "arm64" : "" },
    );
    this.#parts.push(etcdProcess);
    await started(etcdProcess, async () => (await (await fetch(`${this.etcdUrl}/health`)).text()).includes('"health":"true"'), "etcd");

    const redisPort = await freePort();
    const redis = new Process(
      [findBinary("redis-server", "redis-server"), "--port", String(redisPort), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no"],
      join(dir, "redis.log"),
    );
    this.#parts.push(redis);
    await started(redis, () => pong(redisPort), "redis-server");
    const redisUrl = `redis://127.0.0.1:${redisPort}`;

    const auth = ["--acl", join(dir, "acl.yaml"), "--auth-hs256-secret-file", join(dir, "hs256.secret")];
    this.registry = await this.#keep(Service.start("registry", ["--etcd", this.etcdUrl, "--min-ttl-s", "2", ...auth], dir));
    this.context = await this.#keep(Service.start("context", ["--redis", redisUrl, ...auth], dir));
    this.router = await this.#keep(
      Service.start(
        "router",
        [
          "--registry",
          this.registry.url,
          "--redis",
          redisUrl,
          "--callback-secret-file",
          join(dir, "callback.secret"),
          "--allow-private-callbacks",
          "--assertion-key",
          join(dir, "assertion.pem"),
          ...auth,
        ],
        dir,
      ),
    );
  }

  async #keep(service: Promise<Service>): Promise<Service> {
    const started = await service;
    this.#parts.push(started);
    return started;
  }

  /** An HS256 token for `name`, as `agent-reach token issue` makes them. */
  token(name: string, ttlS = 3600): string {
    const now = Math.floor(Date.now() / 1000);
    const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
    const body = b64url(JSON.stringify({ sub: name, iat: now, exp: now + ttlS }));
    const signature = createHmac("sha256", this.secret).update(`${head}.${body}`).digest("base64url");
    return `${head}.${body}.${signature}`;
  }

  /** A hop assertion as the stack's router would sign it (its key, its kid); `key` forges one. */
  async assertion(claims: { audience: string; caller?: string; capability?: string; issuer?: string; ttlS?: number; kid?: string; key?: KeyObject }): Promise<string> {
    const now = Math.floor(Date.now() / 1000);
    return new SignJWT({ cap: claims.capability ?? "test.echo", tenant: "default" })
      .setProtectedHeader({ alg: "EdDSA", kid: claims.kid ?? this.routerKid })
      .setIssuer(claims.issuer ?? "agent-reach-router")
      .setSubject(claims.caller ?? "tester")
      .setAudience(claims.audience)
      .setIssuedAt(now - (claims.ttlS !== undefined && claims.ttlS < 0 ? 60 : 0))
      .setExpirationTime(now + (claims.ttlS ?? 30))
      .sign(claims.key ?? this.routerKey);
  }

  /** The links an agent reads from its environment. */
  agentEnv(name: string): Record<string, string> {
    return {
      AGENT_REACH_REGISTRY: this.registry.url,
      AGENT_REACH_ROUTER: this.router.url,
      AGENT_REACH_CONTEXT: this.context.url,
      AGENT_REACH_TOKEN: this.token(name),
    };
  }

  /** Options wiring an agent to the stack (it verifies the router's assertions with the router's JWKS). */
  agentOptions(name = "ts_agent"): { name: string; registry: string; router: string; context: string; token: string; ttlS: number } {
    return { name, registry: this.registry.url, router: this.router.url, context: this.context.url, token: this.token(name), ttlS: 3 };
  }

  async registryGet(path: string): Promise<Response> {
    return fetch(`${this.registry.url}${path}`, { headers: { authorization: `Bearer ${this.token("tester")}` } });
  }

  /** The registry's record of `agentId`, or undefined. */
  async instance(agentId: string): Promise<Record<string, unknown> | undefined> {
    const response = await this.registryGet(`/v1/agents/${encodeURIComponent(agentId)}`);
    return response.status === 200 ? ((await response.json()) as Record<string, unknown>) : undefined;
  }

  /**
   * Whether the router would send `capability` to `agentId`: the registry resolves it
   * and the router's snapshot holds it (its per-instance gauge on `/metrics`).
   */
  async routable(capability: string, agentId: string): Promise<boolean> {
    const response = await this.registryGet(`/v1/capabilities/${capability}`);
    if (response.status !== 200) return false;
    const body = (await response.json()) as { instances: { agent_id: string }[] };
    if (!body.instances.some((instance) => instance.agent_id === agentId)) return false;
    const metrics = await (await fetch(`${this.router.url}/metrics`)).text();
    return metrics.includes(`agent_reach_router_instance_health_score{agent_id="${agentId}"}`);
  }

  /** `POST /v1/invoke` as `caller` (default `tester`). */
  async invoke(capability: string, payload: unknown, fields: Record<string, unknown> = {}, caller = "tester"): Promise<{ status: number; body: Record<string, unknown> }> {
    const response = await fetch(`${this.router.url}/v1/invoke`, {
      method: "POST",
      headers: { authorization: `Bearer ${this.token(caller)}`, "content-type": "application/json" },
      body: JSON.stringify({ capability, payload, ...fields }),
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  }

  /** Revokes a lease through etcd's JSON gateway (what `etcdctl lease revoke` does). */
  async revokeLease(leaseId: string): Promise<void> {
    const response = await fetch(`${this.etcdUrl}/v3/lease/revoke`, { method: "POST", body: `{"ID":"${leaseId}"}` });
    if (!response.ok) throw new Error(`revoking lease ${leaseId}: ${response.status}`);
  }

  async stop(): Promise<void> {
    for (const part of this.#parts.reverse()) await part.stop();
    rmSync(this.directory, { recursive: true, force: true });
    directories.delete(this.directory);
  }
}
