// An SDK agent against the real registry and router: registration with schemas from
// zod, no traffic before markReady, business errors never retried and "not now" tried
// elsewhere, deadlines, request-id memory, re-registration after lease loss, load in
// heartbeats, drain with work in flight.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { HandlerError, z } from "../src/index.js";
import { forwarded, makeAgent, postToAgent, startAgent } from "./support/agents.js";
import { Stack, waitUntil } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const Text = z.object({ text: z.string().min(1) });

test("registers with schemas from zod and serves only after markReady", async (t) => {
  const agent = makeAgent(stack).handler(
    { capability: "test.upper", version: "1.2.0", description: "Upper-cases.", timeoutMs: 5000, input: Text, output: z.object({ upper: z.string() }) },
    ({ text }, ctx) => ({ upper: `${text.toUpperCase()} for ${String(ctx.source)}` }),
  );
  await startAgent(t, stack, agent, false);
  const record = await stack.instance(agent.agentId);
  assert.equal(record?.["status"], "starting");
  const capability = (record["capabilities"] as Record<string, unknown>[])[0]!;
  assert.equal(capability["name"], "test.upper");
  assert.equal(capability["version"], "1.2.0");
  assert.equal(capability["timeout_ms"], 5000);
  assert.deepEqual((capability["input_schema"] as { required: string[] }).required, ["text"]);
  assert.equal((capability["output_schema"] as { type: string }).type, "object");

  // Registered but not ready: the router sees it and sends it nothing; asked directly, it refuses.
  let early = { status: 0, body: {} as Record<string, unknown> };
  await waitUntil(async () => {
    early = await stack.invoke("test.upper", { text: "a" });
    return early.status !== 404;
  }, 15_000, "the router's snapshot holding the starting instance");
  assert.equal(early.status, 503, JSON.stringify(early.body));
  assert.equal((early.body["error"] as { code: string }).code, "NO_AVAILABLE_INSTANCE");
  const assertion = await stack.assertion({ audience: agent.agentId, capability: "test.upper" });
  const direct = await postToAgent(agent, forwarded("test.upper", { capability_version: "1.2.0" }), { authorization: `Bearer ${assertion}` });
  assert.equal((direct.body["error"] as { code: string }).code, "NOT_READY");
  agent.markReady();
  await waitUntil(() => stack.routable("test.upper", agent.agentId), 15_000, "routable after markReady");
  const called = await stack.invoke("test.upper", { text: "abc" });
  assert.equal(called.status, 200, JSON.stringify(called.body));
  assert.deepEqual(called.body["output"], { upper: "ABC for tester" });
  assert.equal(called.body["agent_id"], agent.agentId);

  // The router refuses what the schema refuses; the SDK checks again on arrival.
  const refused = await stack.invoke("test.upper", { text: "" });
  assert.equal(refused.status, 422);
  assert.equal((refused.body["error"] as { code: string }).code, "SCHEMA_MISMATCH");
});

test("business errors are AGENT_ERROR, never retried; unavailable is tried elsewhere", async (t) => {
  const calls = { flaky: 0, steady: 0 };
  const flaky = makeAgent(stack, { agentId: "ts-flaky-1" }).handler(
    { capability: "test.errors", input: Text, output: z.object({ by: z.string() }) },
    ({ text }) => {
      calls.flaky += 1;
      if (text === "business") throw new HandlerError("ORDER_NOT_FOUND", "no such order", { status: 404 });
      throw HandlerError.unavailable("warming up");
    },
  );
  const steady = makeAgent(stack, { agentId: "ts-steady-1" }).handler(
    { capability: "test.errors", input: Text, output: z.object({ by: z.string() }) },
    ({ text }) => {
      calls.steady += 1;
      if (text === "business") throw new HandlerError("ORDER_NOT_FOUND", "no such order", { status: 404 });
      return { by: "steady" };
    },
  );
  await startAgent(t, stack, flaky);
  await startAgent(t, stack, steady);
  for (let i = 0; i < 6; i += 1) {
    const answer = await stack.invoke("test.errors", { text: "retry" });
    assert.equal(answer.status, 200, JSON.stringify(answer.body));
    assert.deepEqual(answer.body["output"], { by: "steady" });
  }
  assert.ok(calls.flaky >= 1, "the round-robin reached the unavailable instance");
  const business = await stack.invoke("test.errors", { text: "business" });
  assert.equal(business.status, 404);
  const error = business.body["error"] as { code: string; message: string; details: Record<string, unknown> };
  assert.equal(error.code, "AGENT_ERROR");
  assert.equal(error.details["agent_code"], "ORDER_NOT_FOUND");
  assert.equal(business.body["attempts"], 1);
});

test("deadlines: work past its deadline is refused, a slow handler is cut at it", async (t) => {
  let started = 0;
  const agent = makeAgent(stack).handler(
    { capability: "test.slow", input: Text, output: z.object({ ok: z.boolean() }) },
    async (_input, ctx) => {
      started += 1;
      await new Promise((resolve) => {
        ctx.signal.addEventListener("abort", resolve);
      });
      return { ok: ctx.signal.aborted };
    },
  );
  await startAgent(t, stack, agent);
  const assertion = await stack.assertion({ audience: agent.agentId, capability: "test.slow" });
  const late = await postToAgent(agent, forwarded("test.slow", { deadline: Date.now() - 1 }), { authorization: `Bearer ${assertion}` });
  assert.equal(late.status, 504);
  assert.equal((late.body["error"] as { code: string }).code, "DEADLINE_EXCEEDED");
  assert.equal(started, 0, "refused before the handler ran");
  const cut = await stack.invoke("test.slow", { text: "x" }, { timeout_ms: 300 });
  assert.equal(cut.status, 504, JSON.stringify(cut.body));
  assert.equal((cut.body["error"] as { code: string }).code, "DEADLINE_EXCEEDED");
});

test("a repeated request id is answered once, with the first result", async (t) => {
  let runs = 0;
  const agent = makeAgent(stack).handler(
    { capability: "test.once", input: Text, output: z.object({ echo: z.string(), run: z.number() }) },
    async ({ text }) => {
      runs += 1;
      const run = runs;
      await new Promise((resolve) => setTimeout(resolve, 50));
      return { echo: text, run };
    },
  );
  await startAgent(t, stack, agent);
  const [first, concurrent] = await Promise.all([
    stack.invoke("test.once", { text: "first" }, { request_id: "same-id-1" }),
    stack.invoke("test.once", { text: "second" }, { request_id: "same-id-1" }),
  ]);
  const again = await stack.invoke("test.once", { text: "third" }, { request_id: "same-id-1" });
  for (const answer of [first, concurrent, again]) assert.deepEqual(answer.body["output"], first.body["output"]);
  assert.equal(runs, 1);
  const other = await stack.invoke("test.once", { text: "other" }, { request_id: "same-id-2" });
  assert.deepEqual(other.body["output"], { echo: "other", run: 2 });
});

test("registers again after its lease is lost", async (t) => {
  const agent = makeAgent(stack).handler({ capability: "test.lease", input: Text, output: Text }, (input) => input);
  await startAgent(t, stack, agent);
  const raw = await (await stack.registryGet(`/v1/agents/${agent.agentId}`)).text();
  const lease = /"lease_id"\s*:\s*(\d+)/.exec(raw)?.[1] ?? "";
  await stack.revokeLease(lease);
  await waitUntil(async () => {
    const now = await (await stack.registryGet(`/v1/agents/${agent.agentId}`)).text();
    const renewed = /"lease_id"\s*:\s*(\d+)/.exec(now)?.[1];
    return renewed !== undefined && renewed !== lease && now.includes('"status":"ready"');
  }, 15_000, "a new registration under a new lease");
  await waitUntil(() => stack.routable("test.lease", agent.agentId), 15_000, "routable again");
  assert.equal((await stack.invoke("test.lease", { text: "back" })).status, 200);
});

test("load: heartbeats carry the sustained in-flight count and the load status", async (t) => {
  const release: (() => void)[] = [];
  const agent = makeAgent(stack, { maxConcurrency: 4 }).handler(
    { capability: "test.hold", input: Text, output: Text, timeoutMs: 30_000 },
    async (input) => {
      await new Promise<void>((resolve) => release.push(resolve));
      return input;
    },
  );
  await startAgent(t, stack, agent);
  const held = [1, 2, 3].map(() => stack.invoke("test.hold", { text: "x" }));
  await waitUntil(() => agent.inflight === 3, 10_000, "three deliveries in flight");
  // 3 of 4 in flight is `busy` (75 %), sent at once; the next heartbeats carry inflight 3.
  await waitUntil(async () => {
    const record = await stack.instance(agent.agentId);
    return record?.["status"] === "busy" && record["inflight"] === 3;
  }, 15_000, "busy with 3 in flight in the registry");
  agent.reportLoad("overloaded");
  await waitUntil(async () => (await stack.instance(agent.agentId))?.["status"] === "overloaded", 10_000, "overloaded reported");
  agent.reportLoad(undefined);
  for (const resolve of release.splice(0)) resolve();
  await Promise.all(held);
  await waitUntil(async () => {
    const record = await stack.instance(agent.agentId);
    return record?.["status"] === "ready" && record["inflight"] === 0;
  }, 15_000, "ready and idle again");
});

test("stop drains: draining at once, in-flight work finishes, then deregistered", async (t) => {
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const agent = makeAgent(stack).handler(
    { capability: "test.drain", input: Text, output: Text, timeoutMs: 30_000 },
    async (input) => {
      await gate;
      return input;
    },
  );
  await startAgent(t, stack, agent);
  const inflight = stack.invoke("test.drain", { text: "finishes" });
  await waitUntil(() => agent.inflight === 1, 10_000, "one delivery in flight");
  const stopped = agent.stop();
  await waitUntil(async () => (await stack.instance(agent.agentId))?.["status"] === "draining", 10_000, "draining in the registry");
  const assertion = await stack.assertion({ audience: agent.agentId, capability: "test.drain" });
  const refused = await postToAgent(agent, forwarded("test.drain"), { authorization: `Bearer ${assertion}` });
  assert.equal(refused.status, 503);
  assert.equal((refused.body["error"] as { code: string }).code, "DRAINING");
  assert.ok(await stack.instance(agent.agentId), "still registered while work is in flight");
  release();
  const answer = await inflight;
  assert.equal(answer.status, 200, JSON.stringify(answer.body));
  assert.deepEqual(answer.body["output"], { text: "finishes" });
  await stopped;
  assert.equal(await stack.instance(agent.agentId), undefined);
});
