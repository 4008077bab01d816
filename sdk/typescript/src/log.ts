/**
 * The SDK's log lines: one JSON object per line on stderr (`level`, `message`, fields),
 * at `info` and above unless `AGENT_REACH_LOG` says `warn`, `error` or `off`. Tokens and
 * assertions are never logged.
 */

const LEVELS = { info: 1, warn: 2, error: 3, off: 4 } as const;
type Level = Exclude<keyof typeof LEVELS, "off">;

function threshold(): number {
  const wanted = (process.env["AGENT_REACH_LOG"] ?? "info").toLowerCase();
  return wanted in LEVELS ? LEVELS[wanted as keyof typeof LEVELS] : LEVELS.info;
}

let minimum = threshold();

function write(level: Level, message: string, fields: Record<string, unknown>): void {
  if (LEVELS[level] < minimum) return;
  process.stderr.write(`${JSON.stringify({ at: new Date().toISOString(), level, target: "agent_reach", message, ...fields })}\n`);
}

export const log = {
  info: (message: string, fields: Record<string, unknown> = {}): void => { write("info", message, fields); },
  warn: (message: string, fields: Record<string, unknown> = {}): void => { write("warn", message, fields); },
  error: (message: string, fields: Record<string, unknown> = {}): void => { write("error", message, fields); },
  /** Re-reads `AGENT_REACH_LOG` (tests). */
  reload: (): void => {
    minimum = threshold();
  },
};
