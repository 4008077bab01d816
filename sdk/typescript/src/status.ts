/**
 * The status an agent reports (DESIGN §2.2): `starting` → `ready` (after `markReady`) ↔
 * `busy` / `overloaded` (load) → `draining` (final). Load is reported two ways and the
 * heavier wins: by the SDK, from deliveries in flight against `maxConcurrency`
 * ({@link LoadThresholds}), and by the program (`agent.reportLoad`).
 */

export type Status = "starting" | "ready" | "busy" | "overloaded" | "draining";
export type Load = "busy" | "overloaded";

/** Fractions of `maxConcurrency` in flight at which the SDK reports `busy` and `overloaded`. */
export interface LoadThresholds {
  busy: number;
  overloaded: number;
}

export const DEFAULT_THRESHOLDS: LoadThresholds = { busy: 0.75, overloaded: 0.95 };

/**
 * The in-flight counts at which `busy` and `overloaded` begin: ⌈max × fraction⌉ in whole
 * thousandths, each at least 1, busy never above overloaded (the Rust SDK's `LoadThresholds::at`).
 */
export function thresholdsAt(thresholds: LoadThresholds, maxConcurrency: number): [number, number] {
  const begins = (fraction: number): number => {
    const permille = Math.min(1000, Math.max(0, Math.round(fraction * 1000)));
    return Math.max(1, Math.ceil((maxConcurrency * permille) / 1000));
  };
  const busy = begins(thresholds.busy);
  return [busy, Math.max(busy, begins(thresholds.overloaded))];
}

const RANK: Record<"ready" | Load, number> = { ready: 0, busy: 1, overloaded: 2 };

/** The lifecycle phase, the program's reported load and the SDK's own load, as one status. */
export class StatusTracker {
  phase: "starting" | "ready" | "draining" = "starting";
  reported: Load | undefined;
  readonly busyAt: number;
  readonly overloadedAt: number;

  constructor(maxConcurrency: number, thresholds: LoadThresholds) {
    [this.busyAt, this.overloadedAt] = thresholdsAt(thresholds, maxConcurrency);
  }

  current(inflight: number): Status {
    if (this.phase !== "ready") return this.phase;
    const automatic = inflight >= this.overloadedAt ? "overloaded" : inflight >= this.busyAt ? "busy" : "ready";
    if (this.reported === undefined || RANK[automatic] >= RANK[this.reported]) return automatic;
    return this.reported;
  }
}
