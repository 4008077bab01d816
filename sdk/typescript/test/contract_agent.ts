// The TypeScript SDK's conformance agent (sdk/contract/README.md): what every SDK's agent
// serves, for the one contract driver (sdk/contract/driver.py, run by contract.test.ts).
import { setTimeout as sleep } from "node:timers/promises";

import { Agent, HandlerError, z } from "../src/index.js";

const agentId = process.env["CONTRACT_AGENT_ID"] ?? "contract-ts";
const unavailable = process.env["CONTRACT_UNAVAILABLE"] === "1";
let runs = 0;
const Text = z.object({ text: z.string() });

const agent = new Agent({ name: "contract_agent", agentId, ttlS: 3 })
  .handler({ capability: "test.contract.echo", input: Text, output: z.object({ text: z.string(), runs: z.number().int() }) }, ({ text }) => ({
    text,
    runs: (runs += 1),
  }))
  .handler({ capability: "test.contract.slow", input: z.object({ ms: z.number().int() }), output: z.object({ slept: z.number().int() }) }, async ({ ms }, ctx) => {
    await sleep(ms, undefined, { signal: ctx.signal }).catch(() => undefined);
    return { slept: ms };
  })
  .handler({ capability: "test.contract.flaky", input: z.object({}), output: z.object({ agent_id: z.string() }) }, () => {
    if (unavailable) throw HandlerError.unavailable("this instance is not taking work");
    return { agent_id: agentId };
  })
  .streaming({ capability: "test.contract.count", input: z.object({ n: z.number().int() }), item: z.object({ i: z.number().int() }) }, async function* ({ n }) {
    for (let i = 0; i < n; i += 1) yield { i };
  })
  .handler({ capability: "test.contract.task", input: Text, output: Text }, ({ text }, ctx) =>
    ctx.acceptAndReport(async () => {
      await sleep(50);
      return { text: text.toUpperCase() };
    }),
  );

await agent.run();
