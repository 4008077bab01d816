// Delegation chains and budgets (issue 39) with TypeScript agents on the real router: the last
// of three agents sees the whole chain and whom it acts for; `subjects:` and `via:` rules;
// a made-up upstream is not believed; a budget of calls stops the chain with BUDGET_EXHAUSTED
// and what is left is visible to each handler.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { AgentReachError, z, type Ctx } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const Any = z.any();

/** A handler's answer in this test: what it saw, and what its onward call answered. */
interface Hop {
  chain: string[];
  onBehalfOf: string;
  budget: unknown;
  next?: Next;
}

interface Next {
  output?: Hop;
  code?: string;
  details?: Record<string, unknown>;
}

/** The answer of the hop after `hop` (it must have answered). */
function hopAfter(hop: Hop | undefined): Hop {
  const next = hop?.next?.output;
  assert.ok(next, JSON.stringify(hop));
  return next;
}

/** What a handler knows of its place in the chain, and what its onward call answered. */
async function step(ctx: Ctx, next: string | undefined): Promise<Record<string, unknown>> {
  const seen: Record<string, unknown> = { chain: ctx.chain, onBehalfOf: ctx.onBehalfOf ?? null, budget: ctx.budget ?? null };
  if (next === undefined) return seen;
  try {
    return { ...seen, next: { output: await ctx.call(next, {}) } };
  } catch (error) {
    if (!(error instanceof AgentReachError)) throw error;
    return { ...seen, next: { code: error.code, status: error.status ?? null, details: error.details } };
  }
}

test("a three-agent chain knows whom it acts for; via, subjects, forgeries and budgets", async (t) => {
  const first = makeAgent(stack, { name: "ts_first", agentId: "ts-first-1" }).handler(
    { capability: "test.chain.first", input: Any, output: Any },
    (_input, ctx) => step(ctx, "test.chain.middle"),
  );
  const middle = makeAgent(stack, { name: "ts_middle", agentId: "ts-middle-1" }).handler(
    { capability: "test.chain.middle", input: Any, output: Any },
    (_input, ctx) => step(ctx, "test.chain.last"),
  );
  const last = makeAgent(stack, { name: "ts_last", agentId: "ts-last-1" }).handler(
    { capability: "test.chain.last", input: Any, output: Any },
    (_input, ctx) => step(ctx, undefined),
  );
  for (const agent of [first, middle, last]) await startAgent(t, stack, agent);

  const answer = await stack.invoke("test.chain.first", {}, { timeout_ms: 10_000 }, "ts_alice");
  assert.equal(answer.status, 200, JSON.stringify(answer.body));
  const atFirst = answer.body["output"] as Hop;
  const atMiddle = hopAfter(atFirst);
  const atLast = hopAfter(atMiddle);
  assert.deepEqual(atFirst.chain, ["ts_alice"]);
  assert.deepEqual(atMiddle.chain, ["ts_alice", "ts_first"]);
  assert.deepEqual(atLast.chain, ["ts_alice", "ts_first", "ts_middle"]);
  assert.deepEqual([atFirst.onBehalfOf, atMiddle.onBehalfOf, atLast.onBehalfOf], ["ts_alice", "ts_alice", "ts_alice"]);

  // `subjects: [ts_alice]`: ts_bob's chain stops at ts_first's onward call.
  const byBob = await stack.invoke("test.chain.first", {}, { timeout_ms: 10_000 }, "ts_bob");
  const refused = (byBob.body["output"] as Hop).next;
  assert.ok(refused);
  assert.equal(refused.code, "FORBIDDEN");
  assert.deepEqual(refused.details?.["chain"], ["ts_bob", "ts_first"]);

  // `via: [ts_first]`: ts_middle may not call test.chain.last on its own.
  const direct = await stack.invoke("test.chain.last", {}, {}, "ts_middle");
  assert.equal(direct.status, 403);

  // A made-up upstream is not believed.
  const forged = await fetch(`${stack.router.url}/v1/invoke`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${stack.token("ts_middle")}`,
      "content-type": "application/json",
      "agent-reach-upstream": "made.up.token",
    },
    body: JSON.stringify({ capability: "test.chain.last", payload: {} }),
  });
  const forgedBody = (await forged.json()) as { error: { code: string; details: { reason: string } } };
  assert.equal(forged.status, 401);
  assert.deepEqual([forgedBody.error.code, forgedBody.error.details.reason], ["UNAUTHENTICATED", "upstream_invalid"]);

  // A budget of 2 calls: first and middle run, last is refused; each sees what is left.
  const budgeted = await stack.invoke("test.chain.first", {}, { timeout_ms: 10_000, budget: { calls: 2 } }, "ts_alice");
  assert.equal(budgeted.status, 200, JSON.stringify(budgeted.body));
  const budgetFirst = budgeted.body["output"] as Hop;
  const budgetMiddle = hopAfter(budgetFirst);
  assert.deepEqual(budgetFirst.budget, { callsLeft: 1 });
  assert.deepEqual(budgetMiddle.budget, { callsLeft: 0 });
  assert.equal(budgetMiddle.next?.code, "BUDGET_EXHAUSTED");
  assert.deepEqual(budgeted.body["budget"], { calls_left: 0 });
});
