// Streaming handlers (async generators) through the real router (DESIGN §8, "Streaming"):
// items reach the caller one by one while the handler still runs (it waits for the test
// between items: ordering, not timing), an error after the first item is `event: error`,
// one before it an ordinary failed answer, a caller that leaves cancels the handler, and
// a caller that did not ask for events gets the items as the registered array.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { AgentError, Client, HandlerError, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack, waitUntil } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

function gate(): { wait: Promise<void>; open: () => void } {
  let open: () => void = () => undefined;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

test("async generators stream their items through the router", async (t) => {
  const between = gate();
  let closed = false;
  const agent = makeAgent(stack).streaming(
    { capability: "test.tokens", input: z.object({ text: z.string() }), item: z.object({ token: z.string() }) },
    async function* ({ text }, ctx) {
      try {
        if (text === "refuse") throw new HandlerError("REFUSED", "not this prompt");
        yield { token: "first" };
        if (text === "hold") {
          await new Promise((resolve) => {
            ctx.signal.addEventListener("abort", resolve);
          });
          return;
        }
        if (text === "fail") throw new HandlerError("MODEL_FAILED", "the model gave up");
        if (!text.startsWith("collect")) await between.wait;
        for (const word of text.split(" ")) yield { token: word };
      } finally {
        closed = true;
      }
    },
  );
  await startAgent(t, stack, agent);
  const record = await stack.instance(agent.agentId);
  const [capability] = record?.["capabilities"] as { output_schema: { type: string } }[];
  assert.equal(capability?.output_schema.type, "array");

  // Not asked for events: the items as a list.
  const collected = await stack.invoke("test.tokens", { text: "collect two" });
  assert.deepEqual(collected.body["output"], [{ token: "first" }, { token: "collect" }, { token: "two" }]);

  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  const stream = client.stream<{ token: string }>("test.tokens", { text: "hello world" }, { timeoutMs: 10_000 });
  const seen: string[] = [];
  for await (const item of stream) {
    seen.push(item.token);
    // Here while the handler waits at the gate: relayed, not buffered.
    if (item.token === "first") between.open();
  }
  assert.deepEqual(seen, ["first", "hello", "world"]);
  assert.equal(stream.result?.agentId, agent.agentId);
  assert.equal(stream.result.events, 3);

  const failing = client.stream<{ token: string }>("test.tokens", { text: "fail" });
  const before: string[] = [];
  await assert.rejects(
    (async () => {
      for await (const item of failing) before.push(item.token);
    })(),
    (error: unknown) => error instanceof AgentError && error.agentCode === "MODEL_FAILED" && error.message === "the model gave up",
  );
  assert.deepEqual(before, ["first"]);

  // An error before the first item: an ordinary failed answer with the handler's status.
  await assert.rejects(
    (async () => {
      for await (const _ of client.stream("test.tokens", { text: "refuse" })) assert.fail("no item expected");
    })(),
    (error: unknown) => error instanceof AgentError && error.status === 422 && error.agentCode === "REFUSED",
  );

  // The caller goes away: the handler's signal aborts and its generator is closed.
  closed = false;
  for await (const item of client.stream<{ token: string }>("test.tokens", { text: "hold" })) {
    assert.equal(item.token, "first");
    break;
  }
  await waitUntil(() => closed, 10_000, "the handler closed after its caller left");
});
