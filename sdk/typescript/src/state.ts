/**
 * Everything a delivery needs, shared by the server, the lifecycle and the `Agent`:
 * handlers, links, the verifier, the status and the in-flight counts.
 */

import { Dedup } from "./dedup.js";
import type { Verifier } from "./assertion.js";
import type { Links } from "./ctx.js";
import type { Handler } from "./handler.js";
import { StatusTracker, type Status } from "./status.js";

export interface StateSettings {
  agentId: string;
  handlers: readonly Handler[];
  links: Links;
  verifier: Verifier | undefined;
  maxConcurrency: number;
  maxBodyBytes: number;
  ttlS: number;
  status: StatusTracker;
}

export class AgentState {
  readonly agentId: string;
  readonly links: Links;
  readonly verifier: Verifier | undefined;
  readonly maxConcurrency: number;
  readonly maxBodyBytes: number;
  ttlS: number;
  readonly status: StatusTracker;
  readonly dedup = new Dedup();
  /** Preemptible deliveries running now, by request id: what a pause request sets (DESIGN §9). */
  readonly pauses = new Map<string, { requested: boolean }>();
  inflight = 0;
  /** The fewest deliveries in flight since the last heartbeat (what the next one reports). */
  sustainedInflight = 0;
  lastStatus: Status = "starting";
  /** performance.now() of the last heartbeat the registry acknowledged. */
  lastHeartbeat: number | undefined;
  /** Called when the status to report may have changed (the lifecycle sends a heartbeat). */
  onStatusChange: () => void = () => undefined;
  /** capability → version → handler, and each capability's first handler (no key built per delivery). */
  readonly #byCapability = new Map<string, { first: Handler; versions: Map<string, Handler> }>();
  #idle: (() => void)[] = [];

  constructor(settings: StateSettings) {
    this.agentId = settings.agentId;
    this.links = settings.links;
    this.verifier = settings.verifier;
    this.maxConcurrency = settings.maxConcurrency;
    this.maxBodyBytes = settings.maxBodyBytes;
    this.ttlS = settings.ttlS;
    this.status = settings.status;
    for (const handler of settings.handlers) {
      const { name, version } = handler.descriptor;
      const known = this.#byCapability.get(name);
      if (known === undefined) this.#byCapability.set(name, { first: handler, versions: new Map([[version, handler]]) });
      else known.versions.set(version, handler);
    }
  }

  handler(capability: string, version: string): Handler | undefined {
    const known = this.#byCapability.get(capability);
    return known === undefined ? undefined : (known.versions.get(version) ?? known.first);
  }

  currentStatus(): Status {
    return this.status.current(this.inflight);
  }

  /** Tells the lifecycle when the status to report changed. */
  noteStatus(): void {
    const status = this.currentStatus();
    if (status !== this.lastStatus) {
      this.lastStatus = status;
      this.onStatusChange();
    }
  }

  begin(): void {
    this.inflight += 1;
    if (this.inflight >= this.status.busyAt || this.lastStatus !== "ready") this.noteStatus();
  }

  end(): void {
    this.inflight -= 1;
    this.sustainedInflight = Math.min(this.sustainedInflight, this.inflight);
    if (this.inflight + 1 >= this.status.busyAt || this.lastStatus !== "ready") this.noteStatus();
    if (this.inflight === 0 && this.#idle.length > 0) {
      const waiting = this.#idle;
      this.#idle = [];
      for (const resolve of waiting) resolve();
    }
  }

  /**
   * The in-flight count a heartbeat reports: the fewest in flight since the previous one,
   * not the count at the instant (DESIGN §2.3; the Rust and Python SDKs do the same).
   */
  takeSustainedInflight(): number {
    const sustained = Math.min(this.sustainedInflight, this.inflight);
    this.sustainedInflight = this.inflight;
    return sustained;
  }

  /** Resolves once no delivery is in flight. */
  idle(): Promise<void> {
    if (this.inflight === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  heartbeatFresh(): boolean {
    return this.lastHeartbeat !== undefined && performance.now() - this.lastHeartbeat < this.ttlS * 1000;
  }
}
