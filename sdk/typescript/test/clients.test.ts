// Clients that are not ours (issue 34, point 4): the official TypeScript MCP client
// (@modelcontextprotocol/sdk) and the A2A JavaScript SDK's client (@a2a-js/sdk) drive the
// router, against a TypeScript SDK agent on a real stack: MCP lists and calls a tool; A2A
// resolves the card, sends and streams over JSON-RPC and over REST, and reads a durable task.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { GetTaskRequest, SendMessageRequest } from "@a2a-js/sdk";
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, RestTransportFactory } from "@a2a-js/sdk/client";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import { z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

const Order = z.object({ order_id: z.string().min(3), count: z.number().int().min(1).default(1) });
const Priced = z.object({ order_id: z.string(), total_cents: z.number() });
const Text = z.object({ text: z.string() });

function pricing(name = "ts_agent") {
  return makeAgent(stack, { name, agentId: `${name}-clients` })
    .handler({ capability: "test.ts_price", input: Order, output: Priced }, ({ order_id, count }) => ({
      order_id,
      total_cents: 250 * count,
    }))
    .streaming({ capability: "test.ts_words", input: Text, item: z.object({ word: z.string() }) }, async function* ({ text }) {
      for (const word of text.split(" ")) yield { word };
    });
}

/** `fetch` with the caller's bearer token on every request. */
function authed(token: string): typeof fetch {
  return (input, init) => {
    const headers = new Headers(init?.headers);
    headers.set("authorization", `Bearer ${token}`);
    return fetch(input, { ...init, headers });
  };
}

test("the official MCP TypeScript client lists and calls the capabilities its token may call", async (t) => {
  await startAgent(t, stack, pricing());
  const token = stack.token("tester");
  const transport = new StreamableHTTPClientTransport(new URL(`${stack.router.url}/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  const mcp = new McpClient({ name: "agent-reach-test", version: "1.0.0" });
  await mcp.connect(transport);
  t.after(() => mcp.close());
  const tools = await mcp.listTools();
  const price = tools.tools.find((tool) => tool.name === "test.ts_price");
  assert.ok(price, JSON.stringify(tools.tools.map((tool) => tool.name)));
  assert.deepEqual(price.inputSchema.required, ["order_id"]);
  const called = await mcp.callTool({ name: "test.ts_price", arguments: { order_id: "SO-1", count: 2 } });
  assert.equal(called.isError, false, JSON.stringify(called));
  assert.deepEqual(called.structuredContent, { order_id: "SO-1", total_cents: 500 });
  // A refusal is a tool error carrying the router's stable code (in _meta: the tool has an
  // outputSchema, and this client checks structured content against it, error or not).
  const refused = await mcp.callTool({ name: "test.ts_price", arguments: { order_id: "S" } });
  assert.equal(refused.isError, true);
  assert.equal(refused.structuredContent, undefined);
  const error = (refused._meta as { "agent-reach/error": { code: string } } | undefined)?.["agent-reach/error"];
  assert.equal(error?.code, "SCHEMA_MISMATCH");
});

for (const binding of ["JSONRPC", "HTTP+JSON"] as const) {
  test(`the A2A JavaScript client sends, streams and reads tasks over ${binding}`, async (t) => {
    await startAgent(t, stack, pricing(binding === "JSONRPC" ? "ts_agent" : "ts_agent_rest"));
    const fetchImpl = authed(stack.token("tester"));
    const factory = new ClientFactory(
      ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
        transports: [
          // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- the SDK types these options as a class of optional fields
          new JsonRpcTransportFactory({ fetchImpl }),
          // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- as above
          new RestTransportFactory({ fetchImpl }),
        ],
        preferredTransports: [binding],
      }),
    );
    // A trailing slash: the card is resolved relative to the agent's URL.
    const client = await factory.createFromUrl(`${stack.router.url}/a2a/test.ts_price/`);
    const request = (data: Record<string, unknown>, configuration?: Record<string, unknown>) =>
      SendMessageRequest.fromJSON({
        message: { messageId: crypto.randomUUID(), role: "ROLE_USER", parts: [{ data }] },
        ...(configuration === undefined ? {} : { configuration }),
      });
    const sent = await client.sendMessage(request({ order_id: "SO-7", count: 3 }));
    assert.match(JSON.stringify(sent), /"total_cents":750/, JSON.stringify(sent));

    // A durable task: answered at once, then read until it ended.
    const durable = await client.sendMessage(request({ order_id: "SO-8" }, { returnImmediately: true }));
    assert.ok("id" in durable, JSON.stringify(durable));
    assert.match(durable.id, /^t_/);
    let seen = "";
    for (let attempt = 0; attempt < 500 && !seen.includes('"total_cents":250'); attempt += 1) {
      seen = JSON.stringify(await client.getTask(GetTaskRequest.fromJSON({ id: durable.id })));
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.match(seen, /"total_cents":250/, seen);

    const streaming = await factory.createFromUrl(`${stack.router.url}/a2a/test.ts_words/`);
    const events: unknown[] = [];
    for await (const event of streaming.sendMessageStream(request({ text: "ship it" }))) events.push(event);
    const streamed = JSON.stringify(events);
    assert.match(streamed, /"word":"ship"/, streamed);
    assert.match(streamed, /"word":"it"/, streamed);
  });
}
