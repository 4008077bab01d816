// The Vercel AI SDK adapter against the real stack: `generateText` with the capabilities
// as tools, driven by the AI SDK's own test model (MockLanguageModelV3, scripted: call a
// tool, then answer), calls a capability through the router; the tools are the caller's
// under acl.yaml, and a refused call is the tool's error for the model to read.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { capabilityTools, toolName } from "../src/ai.js";
import { Client, RouterError, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

/** A model that calls `tool` with `input` first, then answers with what the tool returned. */
function scripted(tool: string, input: unknown): MockLanguageModelV3 {
  let turn = 0;
  return new MockLanguageModelV3({
    doGenerate: async (options) => {
      turn += 1;
      if (turn === 1) {
        return {
          content: [{ type: "tool-call", toolCallId: "call-1", toolName: tool, input: JSON.stringify(input) }],
          finishReason: { unified: "tool-calls", raw: undefined },
          usage,
          warnings: [],
        };
      }
      const results = options.prompt.flatMap((message) =>
        message.role === "tool" ? message.content.flatMap((part) => (part.type === "tool-result" ? [part.output] : [])) : [],
      );
      return { content: [{ type: "text", text: JSON.stringify(results) }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
    },
  });
}

test("generateText with the capabilities as tools calls a capability through the router", async (t) => {
  const agent = makeAgent(stack, { agentId: "ts-ai-1" })
    .handler(
      { capability: "test.ai.stock", description: "How many of an item are in stock", input: z.object({ sku: z.string() }), output: z.object({ sku: z.string(), on_hand: z.number() }) },
      ({ sku }) => ({ sku, on_hand: 7 }),
    )
    .handler({ capability: "test.ai.price", input: z.string(), output: z.number() }, (sku) => (sku === "A-1" ? 1250 : 0));
  await startAgent(t, stack, agent);
  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  const tools = await capabilityTools(client, { only: ["test.ai.stock", "test.ai.price"] });
  assert.deepEqual(Object.keys(tools).sort(), ["test-ai-price", "test-ai-stock"]);
  assert.equal(tools["test-ai-stock"]?.description, "How many of an item are in stock");

  const stocked = await generateText({
    model: scripted(toolName("test.ai.stock"), { sku: "A-1" }),
    tools,
    stopWhen: stepCountIs(3),
    prompt: "Is A-1 in stock?",
  });
  assert.deepEqual(
    stocked.steps[0]?.toolResults.map((result): unknown[] => [result.toolName, result.output]),
    [["test-ai-stock", { sku: "A-1", on_hand: 7 }]],
  );
  assert.match(stocked.text, /"on_hand":7/);

  // A capability whose input is not an object takes it as `input`.
  const priced = await generateText({ model: scripted("test-ai-price", { input: "A-1" }), tools, stopWhen: stepCountIs(3), prompt: "Price?" });
  assert.deepEqual(priced.steps[0]?.toolResults.map((result): unknown => result.output), [1250]);

  // A call the router refuses is the tool's error, with its code, for the model to read.
  const refused = await generateText({ model: scripted("test-ai-stock", { sku: 5 }), tools, stopWhen: stepCountIs(3), prompt: "?" });
  const errors = refused.steps[0]?.content.flatMap((part) => (part.type === "tool-error" ? [String(part.error)] : [])) ?? [];
  assert.equal(errors.length, 1);
  assert.match(errors[0] ?? "", /SCHEMA_MISMATCH: /);
});

test("the tools are the caller's under the ACL", async (t) => {
  const agent = makeAgent(stack, { agentId: "ts-ai-2" }).handler(
    { capability: "test.ai.hidden", input: z.object({}), output: z.number() },
    () => 1,
  );
  await startAgent(t, stack, agent);
  const demo = new Client({ router: stack.router.url, token: stack.token("demo_user") });
  assert.ok(!Object.keys(await capabilityTools(demo)).includes("test-ai-hidden"));
  await assert.rejects(capabilityTools(demo, { only: ["test.ai.hidden"] }), (error: unknown) => error instanceof RouterError && error.code === "CAPABILITY_NOT_FOUND");
});
