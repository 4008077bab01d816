// TypeScript SDK cost: an SDK echo agent's throughput through the router against a bare
// node:http echo agent doing the same work (decode the envelope, answer the payload), same run.
//
//     cd sdk/typescript && npm run bench [-- --rounds 5 --duration-s 5 --connections 32]
//     cd sdk/typescript && npm run bench -- --smoke   # the whole path for a second: numbers, no verdict (CI)
//
// Starts etcd, Redis, the registry, router and context service (the release build when
// present: `cargo build --release -p agent-reach-cli`; the debug build otherwise, which may
// make the router the bottleneck), both agents as their own processes, and `wrk` against
// `POST /v1/invoke` for each capability. Rounds alternate the two so both share the box's
// phases; the verdict is on the median round. Target (issue 40): the SDK costs <= 10 % of
// the bare agent's requests per second.
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { Process, REPO, Stack, temporaryDirectory, waitUntil } from "../test/support/stack.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "5" },
    "duration-s": { type: "string", default: "5" },
    connections: { type: "string", default: "32" },
    smoke: { type: "boolean", default: false },
  },
});
// A smoke run (scripts/test.sh): every process and both agents for a second, no verdict.
const smoke = values.smoke;
const rounds = smoke ? 1 : Number(values.rounds);
const seconds = smoke ? 1 : Number(values["duration-s"]);
const connections = smoke ? 4 : Number(values.connections);

interface Run {
  rps: number;
  p50: string;
  cpuUsPerRequest: number;
}

function wrk(url: string, script: string, duration: number): { rps: number; p50: string; bad: number } {
  const out = execFileSync("wrk", ["-t1", `-c${connections}`, `-d${duration}s`, "--latency", "-s", script, url], { encoding: "utf8" });
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? "0");
  const p50 = /50%\s+(\S+)/.exec(out)?.[1] ?? "?";
  const bad = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? "0");
  return { rps, p50, bad };
}

function cpuSeconds(pid: number): number {
  const fields = (readFileSync(`/proc/${pid}/stat`, "utf8").split(")").pop() ?? "").trim().split(/\s+/);
  // utime and stime, in clock ticks (100 a second on Linux).
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0;

const target = process.env["CARGO_TARGET_DIR"] ?? join(REPO, "target");
if (!smoke && existsSync(join(target, "release", "agent-reach"))) {
  process.env["AGENT_REACH_BIN_DIR"] = join(target, "release");
  console.log(`router: release build (${join(target, "release", "agent-reach")})`);
} else {
  console.log("router: DEBUG build (no release build found): the router may bound both numbers");
}
console.log(`node ${process.version}, ${rounds} rounds of ${seconds} s, wrk -t1 -c${connections}`);

const stack = await Stack.start();
const work = temporaryDirectory("ts-bench-");
const agents: Record<"sdk" | "bare", Process> = {
  // BENCH_PROFILE=DIR: the SDK agent writes a V8 CPU profile there when it stops.
  sdk: new Process([process.execPath, ...(process.env["BENCH_PROFILE"] === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${process.env["BENCH_PROFILE"]}`]), join(HERE, "sdk_echo.js")], join(work, "sdk.log"), { ...stack.agentEnv("ts_agent"), AGENT_REACH_LOG: "warn" }),
  bare: new Process([process.execPath, ...(process.env["BENCH_PROFILE"] === undefined ? [] : ["--cpu-prof", `--cpu-prof-dir=${process.env["BENCH_PROFILE"]}/bare`]), join(HERE, "bare_echo.js")], join(work, "bare.log"), stack.agentEnv("ts_agent")),
};
try {
  await waitUntil(() => stack.routable("test.echo_sdk", "bench_sdk-1"), 30_000, "the SDK agent");
  await waitUntil(() => stack.routable("test.echo_bare", "bench_bare-1"), 30_000, "the bare agent");
  const token = stack.token("tester", 24 * 3600);
  const scripts: Record<"sdk" | "bare", string> = { sdk: "", bare: "" };
  for (const name of ["sdk", "bare"] as const) {
    const body = JSON.stringify({ capability: `test.echo_${name}`, payload: { text: "hello, agent", n: 42 } });
    scripts[name] = join(work, `${name}.lua`);
    writeFileSync(
      scripts[name],
      `wrk.method = "POST"\nwrk.body = '${body}'\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer ${token}"\n`,
    );
  }
  const url = `${stack.router.url}/v1/invoke`;
  // Warm-up, as long as a round: V8 optimises the hot functions after thousands of calls, and
  // the SDK has more of them than the bare agent (a 2 s warm-up left its first round behind).
  for (const name of ["sdk", "bare"] as const) wrk(url, scripts[name], seconds);
  const results: Record<"sdk" | "bare", Run[]> = { sdk: [], bare: [] };
  for (let round = 0; round < rounds; round += 1) {
    const order = round % 2 === 0 ? (["sdk", "bare"] as const) : (["bare", "sdk"] as const);
    for (const name of order) {
      const pid = agents[name].child.pid ?? 0;
      const before = cpuSeconds(pid);
      const { rps, p50, bad } = wrk(url, scripts[name], seconds);
      const used = cpuSeconds(pid) - before;
      if (bad > 0) throw new Error(`${name}: ${bad} non-2xx answers; see ${work}`);
      results[name].push({ rps, p50, cpuUsPerRequest: (used / (rps * seconds)) * 1e6 });
    }
    const sdk = results.sdk.at(-1)?.rps ?? 0;
    const bare = results.bare.at(-1)?.rps ?? 1;
    console.log(`round ${round + 1}: sdk ${sdk.toFixed(0)} req/s, bare ${bare.toFixed(0)} req/s (${((sdk / bare) * 100).toFixed(1)} %)`);
  }
  console.log("");
  for (const name of ["sdk", "bare"] as const) {
    const sorted = [...results[name]].sort((a, b) => a.rps - b.rps);
    const middle = sorted[Math.floor(sorted.length / 2)];
    console.log(
      `${name.padStart(4)}: ${middle?.rps.toFixed(0)} req/s (median of ${rounds}), p50 ${middle?.p50}, agent CPU ${median(results[name].map((r) => r.cpuUsPerRequest)).toFixed(0)} us/request`,
    );
  }
  // The agents alone, without the router: wrk posts forwarded envelopes straight to each
  // (unique request ids, an assertion signed with the router's key): the SDK's own cost.
  const direct: Record<"sdk" | "bare", Run[]> = { sdk: [], bare: [] };
  const endpoints: Record<"sdk" | "bare", string> = { sdk: "", bare: "" };
  for (const name of ["sdk", "bare"] as const) {
    const record = await stack.instance(`bench_${name}-1`);
    const endpoint = record?.["endpoint"];
    endpoints[name] = typeof endpoint === "string" ? endpoint : "";
  }
  const assertion = await stack.assertion({ audience: "bench_sdk-1", capability: "test.echo_sdk", ttlS: 3600 });
  for (let round = 0; round < rounds; round += 1) {
    const order = round % 2 === 0 ? (["sdk", "bare"] as const) : (["bare", "sdk"] as const);
    for (const name of order) {
      const script = join(work, `direct-${name}-${round}.lua`);
      writeFileSync(
        script,
        [
          "local counter = 0",
          `local headers = { ["content-type"] = "application/json", ["authorization"] = "Bearer ${assertion}" }`,
          "request = function()",
          "  counter = counter + 1",
          `  local body = string.format('{"version":"1.0","request_id":"d${round}-%d","capability":"test.echo_sdk","capability_version":"1.0.0","source":"tester","priority":"normal","deadline":${Date.now() + 3_600_000},"attempt":1,"payload":{"text":"hello, agent","n":42}}', counter)`,
          '  return wrk.format("POST", nil, headers, body)',
          "end",
          "",
        ].join("\n"),
      );
      const pid = agents[name].child.pid ?? 0;
      const before = cpuSeconds(pid);
      const { rps, p50, bad } = wrk(endpoints[name], script, seconds);
      const used = cpuSeconds(pid) - before;
      if (bad > 0) throw new Error(`direct ${name}: ${bad} non-2xx answers; see ${work}`);
      direct[name].push({ rps, p50, cpuUsPerRequest: (used / (rps * seconds)) * 1e6 });
    }
  }
  for (const name of ["sdk", "bare"] as const) {
    console.log(
      `${name.padStart(4)} alone: ${median(direct[name].map((r) => r.rps)).toFixed(0)} req/s (median of ${rounds}), agent CPU ${median(direct[name].map((r) => r.cpuUsPerRequest)).toFixed(0)} us/request`,
    );
  }
  const alone = median(direct.sdk.map((run, i) => run.rps / (direct.bare[i]?.rps ?? 1)));
  console.log(`the agents alone (no router): the SDK's throughput ${(alone * 100).toFixed(1)} % of the bare agent's`);

  const ratio = median(results.sdk.map((run, i) => run.rps / (results.bare[i]?.rps ?? 1)));
  const cost = 1 - ratio;
  const cpu = median(results.sdk.map((r) => r.cpuUsPerRequest)) / median(results.bare.map((r) => r.cpuUsPerRequest));
  const verdict = smoke ? "smoke run, no verdict" : `target <= 10 %: ${cost <= 0.1 ? "met" : "NOT met"}`;
  console.log(
    `SDK throughput ${(ratio * 100).toFixed(1)} % of the bare agent (median round): the SDK costs ${(cost * 100).toFixed(1)} %; ` +
      `${verdict} (agent CPU per request ${cpu.toFixed(2)}x the bare agent's)`,
  );
} finally {
  // SIGTERM first: each agent deregisters (and a profiled one writes its profile), then the bound.
  for (const agent of Object.values(agents)) {
    agent.child.kill("SIGTERM");
    await agent.exited(10_000).catch(() => undefined);
    await agent.stop();
  }
  await stack.stop();
}
