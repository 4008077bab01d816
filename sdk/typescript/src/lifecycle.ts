/**
 * Registration and liveness over the registry's HTTP API (DESIGN §2.3, §2.6).
 *
 * `POST /v1/agents` registers the instance (as `starting` until `markReady`), `PUT
 * /v1/agents/{id}/heartbeat` every `heartbeat_interval_s` (TTL/3) and at once when the
 * status to report changes (at most every 500 ms), with the in-flight count.
 * `LEASE_EXPIRED` means register again; an unreachable registry means try the next one,
 * then back off (capped at 5 s), so an agent outlives a registry restart by itself.
 * `DELETE /v1/agents/{id}` deregisters when the agent stops.
 */

import { AgentReachError, LeaseExpired, RegistrationRefused, RegistryError } from "./errors.js";
import type { Descriptor } from "./handler.js";
import { log } from "./log.js";
import type { AgentState } from "./state.js";
import type { Status } from "./status.js";
import { isObject, jsonHeaders, send, serviceAnswer, serviceError } from "./wire.js";

const MAX_BACKOFF_MS = 5000;
/** Status changes are sent at most this often, so a load hovering at a threshold is not a stream of writes. */
const MIN_STATUS_INTERVAL_MS = 500;

export interface Registration {
  agentId: string;
  name: string;
  endpoint: string;
  weight: number;
  ttlS: number;
  tags: Record<string, string> | undefined;
  capabilities: Descriptor[];
}

export class Lifecycle {
  readonly #state: AgentState;
  readonly #registries: string[];
  readonly #token: string;
  readonly #registration: Registration;
  #current = 0;
  #failures = 0;
  /** etcd lease ids are 64-bit: kept as the registry wrote them, never as a JS number. */
  #leaseId: string | undefined;
  #intervalMs = 5000;
  #lastStatusSent = 0;
  /** The status the registry holds (the last one sent). */
  #sentStatus: Status = "starting";
  #stopping = false;
  #wake: (() => void) | undefined;
  #loop: Promise<void> | undefined;

  constructor(state: AgentState, registries: string[], token: string, registration: Registration) {
    this.#state = state;
    this.#registries = registries;
    this.#token = token;
    this.#registration = registration;
    state.onStatusChange = () => this.#wake?.();
  }

  get #registry(): string {
    return this.#registries[this.#current] ?? "";
  }

  get #agentPath(): string {
    return `${this.#registry}/v1/agents/${encodeURIComponent(this.#registration.agentId)}`;
  }

  /** The registry in use failed: move to the next; true when that one is to be tried at once. */
  #failed(): boolean {
    if (this.#registries.length > 1) {
      const before = this.#registry;
      this.#current = (this.#current + 1) % this.#registries.length;
      log.warn("Registry failed; moving to the next one.", { failed: before, next: this.#registry });
    }
    this.#failures += 1;
    if (this.#failures < this.#registries.length) return true;
    this.#failures = 0;
    return false;
  }

  async #register(): Promise<void> {
    const status = this.#state.currentStatus();
    // A draining agent never registers anew.
    const registered: Status = status === "draining" ? "starting" : status;
    const r = this.#registration;
    const body: Record<string, unknown> = {
      agent_id: r.agentId,
      name: r.name,
      endpoint: r.endpoint,
      protocol: "http",
      weight: r.weight,
      ttl_s: r.ttlS,
      status: registered,
      capabilities: r.capabilities,
    };
    if (r.tags !== undefined) body["tags"] = r.tags;
    const response = await send("registry", `${this.#registry}/v1/agents`, {
      method: "POST",
      headers: jsonHeaders(this.#token),
      body: JSON.stringify(body),
      timeoutMs: 5000,
    });
    const text = await response.text();
    let answer: unknown;
    try {
      answer = JSON.parse(text);
    } catch {
      answer = undefined;
    }
    if (!response.ok) throw serviceError("registry", response.status, answer);
    const lease = /"lease_id"\s*:\s*(-?\d+)/.exec(text)?.[1];
    if (lease === undefined || !isObject(answer)) throw new RegistryError("INVALID_ANSWER", "the registration answer has no lease_id");
    this.#leaseId = lease;
    this.#intervalMs = Math.max(500, Number(answer["heartbeat_interval_s"] ?? 5) * 1000);
    this.#state.lastHeartbeat = performance.now();
    this.#sentStatus = registered;
    log.info("Registered.", { agent_id: r.agentId, lease_id: lease, status: registered, registry: this.#registry });
  }

  /** Registers once (a refusal throws {@link RegistrationRefused}), then keeps alive in the background. */
  async start(): Promise<void> {
    for (const _ of this.#registries) {
      try {
        await this.#register();
        break;
      } catch (caught) {
        // The registries share one catalog: a refusal from one is everyone's.
        if (caught instanceof RegistryError && caught.status !== undefined && caught.status >= 400 && caught.status < 500) {
          throw this.#refusal(caught);
        }
        log.warn("Registration failed.", { registry: this.#registry, error: String(caught) });
        this.#failed();
      }
    }
    this.#failures = 0;
    this.#loop = this.#run();
  }

  #refusal(error: RegistryError): RegistrationRefused {
    let message = error.message;
    const index = /^capabilities\[(\d+)\]/.exec(error.field ?? "")?.[1];
    const capability = index === undefined ? undefined : this.#registration.capabilities[Number(index)];
    if (capability !== undefined) message = `the handler for \`${capability.name}\` ${capability.version}: ${message}`;
    return new RegistrationRefused(error.code, `the registry refused the registration: ${message}`, {
      status: error.status,
      field: error.field,
      details: error.details,
    });
  }

  async #run(): Promise<void> {
    let backoff = 100;
    while (!this.#stopping) {
      if (this.#leaseId === undefined) {
        try {
          await this.#register();
          backoff = 100;
          this.#failures = 0;
        } catch (caught) {
          log.warn("Registration failed; retrying.", { registry: this.#registry, error: String(caught), retry_in_ms: backoff });
          if (this.#failed()) continue;
          await this.#sleep(backoff);
          backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
          continue;
        }
      }
      await this.#untilBeat();
      if (this.#stopped()) return;
      if (await this.#beat()) {
        backoff = 100;
        continue;
      }
      await this.#sleep(backoff);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  /** Heartbeats, through the next registries at once when one fails; false when each failed in a row. */
  async #beat(): Promise<boolean> {
    for (;;) {
      try {
        await this.heartbeat();
        this.#failures = 0;
        return true;
      } catch (caught) {
        if (caught instanceof LeaseExpired) {
          log.warn("Lease expired; registering again.", { agent_id: this.#registration.agentId });
          this.#leaseId = undefined;
          return true;
        }
        log.warn("Heartbeat failed.", { registry: this.#registry, error: String(caught) });
        if (!this.#failed()) return false;
      }
    }
  }

  /** One heartbeat with the current status and the sustained in-flight count. */
  async heartbeat(): Promise<void> {
    if (this.#leaseId === undefined) return;
    const status = this.#state.currentStatus();
    const inflight = this.#state.takeSustainedInflight();
    this.#lastStatusSent = performance.now();
    const response = await send("registry", `${this.#agentPath}/heartbeat`, {
      method: "PUT",
      headers: jsonHeaders(this.#token),
      body: `{"lease_id":${this.#leaseId},"status":"${status}","inflight":${inflight}}`,
      timeoutMs: 5000,
    });
    await serviceAnswer(response, "registry");
    this.#sentStatus = status;
    this.#state.lastHeartbeat = performance.now();
  }

  /** Until a heartbeat is due: the interval, or a status change (not sooner than the minimum spacing), or the stop. */
  async #untilBeat(): Promise<void> {
    const due = performance.now() + this.#intervalMs;
    while (!this.#stopping) {
      const now = performance.now();
      if (now >= due) return;
      if (this.#state.currentStatus() !== this.#sentStatus) {
        const spacing = this.#lastStatusSent + MIN_STATUS_INTERVAL_MS - now;
        if (spacing <= 0) return;
        await this.#sleep(Math.min(spacing, due - now));
        continue;
      }
      await this.#sleep(due - now);
    }
  }

  /** Sleeps `ms`, woken early by a status change or the stop. */
  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.#wake = done;
    });
  }

  /** Sends `draining` at once (bounded), so routers stop sending work before in-flight work ends. */
  async announceDraining(): Promise<void> {
    try {
      await this.heartbeat();
    } catch (caught) {
      log.warn("Could not report draining; deregistering soon anyway.", { error: String(caught) });
    }
  }

  #stopped(): boolean {
    return this.#stopping;
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    this.#wake?.();
    await this.#loop;
  }

  /** Deregisters, each registry getting one try (the one in use first). */
  async deregister(): Promise<void> {
    for (const _ of this.#registries) {
      try {
        const response = await send("registry", this.#agentPath, {
          method: "DELETE",
          headers: jsonHeaders(this.#token),
          timeoutMs: 5000,
        });
        await serviceAnswer(response, "registry");
        log.info("Deregistered.", { agent_id: this.#registration.agentId });
        return;
      } catch (caught) {
        if (caught instanceof AgentReachError && caught.status !== undefined && caught.status >= 400 && caught.status < 500) {
          log.warn("Deregistration refused.", { registry: this.#registry, error: String(caught) });
          return;
        }
        log.warn("Deregistration failed.", { registry: this.#registry, error: String(caught) });
        this.#failed();
      }
    }
    log.warn("Deregistration failed on every registry; the lease will expire.");
  }
}
