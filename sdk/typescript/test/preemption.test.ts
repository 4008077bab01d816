// Preemption with a TypeScript agent (DESIGN §9): a preemptible handler asked to pause
// throws Paused with a checkpoint; its task becomes `paused`, the urgent task runs, and the
// paused one resumes from the checkpoint on its next delivery.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, Paused, taskOutput, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack, waitUntil } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const Job = z.object({ id: z.string(), steps: z.number().int() });
const Done = z.object({ id: z.string(), resumedFrom: z.number().int() });

test("a preemptible handler pauses for a high-priority task and resumes from its checkpoint", async (t) => {
  const starts: [string, number][] = [];
  const agent = makeAgent(stack, { maxConcurrency: 1 }).handler(
    { capability: "test.ts_long", input: Job, output: Done, preemptible: true },
    async (job, ctx) => {
      const checkpoint = ctx.checkpoint as { done?: number } | undefined;
      const from = checkpoint?.done ?? 0;
      starts.push([job.id, from]);
      for (let step = from; step < job.steps; step += 1) {
        if (ctx.pauseRequested) throw new Paused({ done: step });
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      return { id: job.id, resumedFrom: from };
    },
  );
  await startAgent(t, stack, agent);
  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  const low = await client.submitTask("test.ts_long", { id: "low", steps: 60 }, { priority: "low", timeoutMs: 30_000 });
  await waitUntil(() => starts.length > 0, 15_000, "the low task started");
  const high = await client.submitTask("test.ts_long", { id: "high", steps: 2 }, { priority: "high", timeoutMs: 30_000 });
  const highDone = await client.waitTask(high.taskId, { timeoutMs: 30_000 });
  const lowDone = await client.waitTask(low.taskId, { timeoutMs: 30_000 });
  assert.equal(highDone.status, "succeeded");
  assert.equal(lowDone.status, "succeeded");
  assert.ok(lowDone.transitions.some((transition) => transition.status === "paused"), JSON.stringify(lowDone.transitions));
  const resumedFrom = (taskOutput(lowDone) as { resumedFrom: number }).resumedFrom;
  assert.ok(resumedFrom > 0, "resumed from its checkpoint");
  assert.deepEqual(
    starts.filter(([id]) => id === "low").map(([, from]) => from),
    [0, resumedFrom],
  );
});
