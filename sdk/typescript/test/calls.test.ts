// An agent calling onwards and sharing context: ctx.call and ctx.stream through the router,
// ctx.context patches through the context service, a Client's typed errors, and the 202
// flow: a task's delivery answered at once, its result reported later (acceptAndReport).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Accepted, AgentError, CapabilityNotFound, Client, Forbidden, HandlerError, SchemaMismatch, TaskNotFound, taskOutput, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack, waitUntil } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const Text = z.object({ text: z.string() });

test("ctx.call, ctx.stream and context patches go through the router and the context service", async (t) => {
  const words = makeAgent(stack, { agentId: "ts-words-1" })
    .handler({ capability: "test.count", input: Text, output: z.object({ words: z.number() }) }, ({ text }) => ({
      words: text.split(" ").length,
    }))
    .streaming({ capability: "test.words", input: Text, item: z.string() }, async function* ({ text }) {
      for (const word of text.split(" ")) yield word;
    });
  const front = makeAgent(stack, { agentId: "ts-front-1" }).handler(
    { capability: "test.front", input: Text, output: z.object({ words: z.number(), streamed: z.array(z.string()), caller: z.string() }) },
    async ({ text }, ctx) => {
      const counted = await ctx.call("test.count", { text }, { output: z.object({ words: z.number() }) });
      const streamed: string[] = [];
      const stream = ctx.stream<string>("test.words", { text });
      for await (const word of stream) streamed.push(word);
      await ctx.context.patch({ set: { "summary.words": counted.words } });
      const seen = await ctx.context.get(["summary.words"]);
      return { words: Number(seen.fields["summary.words"]), streamed, caller: stream.result?.agentId ?? "" };
    },
  );
  await startAgent(t, stack, words);
  await startAgent(t, stack, front);
  const client = new Client({ router: stack.router.url, context: stack.context.url, token: stack.token("tester") });
  const context = await client.contexts?.create({ fields: { user_id: "ada" } });
  assert.ok(context);
  const result = await client.invoke("test.front", { text: "one two three" }, { contextId: context.contextId, sessionId: "s-1" });
  assert.deepEqual(result.output, { words: 3, streamed: ["one", "two", "three"], caller: "ts-words-1" });
  assert.equal(result.agentId, "ts-front-1");
  const read = await client.contexts?.get(context.contextId);
  assert.equal(read?.fields["summary.words"], 3);
  assert.equal(read.fields["user_id"], "ada");
});

test("a Client's failures are typed errors carrying the router's codes", async (t) => {
  const agent = makeAgent(stack).handler({ capability: "test.strict", input: z.object({ n: z.number() }), output: z.number() }, ({ n }) => n * 2);
  await startAgent(t, stack, agent);
  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  assert.equal((await client.invoke<number>("test.strict", { n: 21 })).output, 42);
  await assert.rejects(client.invoke("test.strict", { n: "no" }), (error: unknown) => {
    return error instanceof SchemaMismatch && error.status === 422 && Array.isArray(error.details["errors"]);
  });
  await assert.rejects(client.invoke("test.nothing_here", {}), CapabilityNotFound);
  await assert.rejects(client.task("t_000000000000000000000000"), TaskNotFound);
});

test("the 202 flow: a task's delivery is accepted at once and its result reported", async (t) => {
  let release: () => void = () => undefined;
  const later = new Promise<void>((resolve) => (release = resolve));
  let accepted = 0;
  const agent = makeAgent(stack).handler(
    { capability: "test.report", input: Text, output: z.object({ report: z.string() }), timeoutMs: 30_000 },
    (input, ctx) => {
      accepted += 1;
      return ctx.acceptAndReport(async () => {
        await later;
        if (input.text === "fail") throw new HandlerError("NO_DATA", "nothing for that month");
        return { report: `report for ${input.text}` };
      });
    },
  );
  await startAgent(t, stack, agent);
  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  const task = await client.submitTask("test.report", { text: "2026-11" }, { sessionId: "s-report" });
  const failing = await client.submitTask("test.report", { text: "fail" });
  // Accepted (202) while the work still waits: the tasks run, no result yet.
  await waitUntil(async () => accepted === 2 && (await client.task(task.taskId)).status === "running", 15_000, "both deliveries accepted");
  assert.equal((await client.task(task.taskId)).result, undefined);
  release();
  const done = await client.waitTask(task.taskId, { timeoutMs: 15_000 });
  assert.equal(done.status, "succeeded");
  assert.deepEqual(taskOutput(done), { report: "report for 2026-11" });
  const failed = await client.waitTask(failing.taskId, { timeoutMs: 15_000 });
  assert.equal(failed.status, "failed");
  assert.throws(() => taskOutput(failed), (error: unknown) => error instanceof AgentError && error.agentCode === "NO_DATA");
  assert.equal(accepted, 2, "each task delivered once");
  const results = await client.sessionResults("s-report");
  assert.deepEqual(results.results.map((entry) => entry.taskId), [task.taskId]);
});

test("the 202 flow by hand: answer Accepted, report once with reportResult, as the delivering agent only", async (t) => {
  const delivered: string[] = [];
  const agent = makeAgent(stack).handler(
    { capability: "test.later", input: Text, output: Text, timeoutMs: 30_000 },
    (_input, ctx) => {
      delivered.push(ctx.taskId ?? "");
      throw new Accepted();
    },
  );
  await startAgent(t, stack, agent);
  const caller = new Client({ router: stack.router.url, token: stack.token("tester") });
  const task = await caller.submitTask("test.later", { text: "x" });
  await waitUntil(() => delivered.includes(task.taskId), 15_000, "the task delivered");
  await waitUntil(async () => (await caller.task(task.taskId)).status === "running", 15_000, "the task running after 202");
  await assert.rejects(caller.reportResult(task.taskId, { output: { text: "not mine" } }), Forbidden);
  const asAgent = new Client({ router: stack.router.url, token: stack.token("ts_agent") });
  const first = await asAgent.reportResult(task.taskId, { output: { text: "done" } });
  assert.deepEqual([first.status, first.duplicate], ["succeeded", false]);
  const again = await asAgent.reportResult(task.taskId, { output: { text: "done" } });
  assert.equal(again.duplicate, true);
  assert.deepEqual(taskOutput(await caller.waitTask(task.taskId)), { text: "done" });
});
