// Clients that are not ours (issue 34, point 4): the official TypeScript MCP client
// (@modelcontextprotocol/sdk), the A2A JavaScript SDK's client (@a2a-js/sdk) and the MCP
// Inspector's CLI drive the router, against a TypeScript SDK agent on a real stack: MCP
// lists and calls a tool, and follows a task to its result; A2A resolves the card, sends and
// streams over JSON-RPC, REST and gRPC, reads a durable task, resubscribes to one running,
// keeps push configs, and holds a multi-turn conversation whose agent asks for input.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import {
  DeleteTaskPushNotificationConfigRequest,
  GetTaskPushNotificationConfigRequest,
  GetTaskRequest,
  ListTaskPushNotificationConfigsRequest,
  SendMessageRequest,
  SubscribeToTaskRequest,
  TaskPushNotificationConfig,
  TaskState,
  type Message as A2aMessage,
  type Task,
} from "@a2a-js/sdk";
import {
  ClientFactory,
  ClientFactoryOptions,
  JsonRpcTransportFactory,
  RestTransportFactory,
  type Client as A2aClient,
  type RequestOptions,
} from "@a2a-js/sdk/client";
import { GrpcTransportFactory } from "@a2a-js/sdk/client/grpc";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import { InputRequired, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { REPO, Stack } from "./support/stack.js";

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

/** The caller's token as service parameters: the gRPC transport sends them as metadata. */
function bearerOf(token: string): RequestOptions {
  return { serviceParameters: { authorization: `Bearer ${token}` } };
}

/** A client factory preferring `binding`, every transport carrying the caller's token. */
function a2aFactory(token: string, binding: "JSONRPC" | "HTTP+JSON" | "GRPC"): ClientFactory {
  const fetchImpl = authed(token);
  return new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [
        // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- the SDK types these options as a class of optional fields
        new JsonRpcTransportFactory({ fetchImpl }),
        // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- as above
        new RestTransportFactory({ fetchImpl }),
        new GrpcTransportFactory(),
      ],
      preferredTransports: [binding],
    }),
  );
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

for (const binding of ["JSONRPC", "HTTP+JSON", "GRPC"] as const) {
  test(`the A2A JavaScript client sends, streams and reads tasks over ${binding}`, async (t) => {
    await startAgent(t, stack, pricing(binding === "JSONRPC" ? "ts_agent" : "ts_agent_rest"));
    const factory = a2aFactory(stack.token("tester"), binding);
    // A trailing slash: the card is resolved relative to the agent's URL.
    const client = await factory.createFromUrl(`${stack.router.url}/a2a/test.ts_price/`);
    const bearer = bearerOf(stack.token("tester"));
    const request = (data: Record<string, unknown>, configuration?: Record<string, unknown>) =>
      SendMessageRequest.fromJSON({
        message: { messageId: crypto.randomUUID(), role: "ROLE_USER", parts: [{ data }] },
        ...(configuration === undefined ? {} : { configuration }),
      });
    const sent = await client.sendMessage(request({ order_id: "SO-7", count: 3 }), bearer);
    assert.match(JSON.stringify(sent), /"total_cents":750/, JSON.stringify(sent));

    // A durable task: answered at once, then read until it ended.
    const durable = await client.sendMessage(request({ order_id: "SO-8" }, { returnImmediately: true }), bearer);
    assert.ok("id" in durable, JSON.stringify(durable));
    assert.match(durable.id, /^t_/);
    let seen = "";
    for (let attempt = 0; attempt < 500 && !seen.includes('"total_cents":250'); attempt += 1) {
      seen = JSON.stringify(await client.getTask(GetTaskRequest.fromJSON({ id: durable.id }), bearer));
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.match(seen, /"total_cents":250/, seen);

    const streaming = await factory.createFromUrl(`${stack.router.url}/a2a/test.ts_words/`);
    const events: unknown[] = [];
    for await (const event of streaming.sendMessageStream(request({ text: "ship it" }), bearer)) events.push(event);
    const streamed = JSON.stringify(events);
    assert.match(streamed, /"word":"ship"/, streamed);
    assert.match(streamed, /"word":"it"/, streamed);
  });
}

const Shirt = z.object({ style: z.string().optional(), size: z.string().optional(), color: z.string().optional() });
const Ordered = z.object({ style: z.string(), size: z.string(), color: z.string(), turns: z.number() });

/** An agent asking for what an order lacks, reading the conversation so far (`ctx.history`). */
function shirts() {
  return makeAgent(stack, { name: "ts_agent", agentId: "ts_agent-shirts" }).handler(
    { capability: "test.ts_shirt", input: Shirt, output: Ordered },
    (shirt, ctx) => {
      const known: Record<string, string> = {};
      for (const turn of ctx.history) if (turn.role === "user") Object.assign(known, turn.payload);
      Object.assign(known, shirt);
      for (const needed of ["size", "color"]) if (known[needed] === undefined) throw new InputRequired(`Which ${needed}?`);
      return { style: known["style"] ?? "tee", size: known["size"] ?? "", color: known["color"] ?? "", turns: ctx.history.length };
    },
  );
}

/** A message to a task (or none), its payload one DataPart. */
function message(data: Record<string, unknown>, taskId?: string, configuration?: Record<string, unknown>) {
  return SendMessageRequest.fromJSON({
    message: { messageId: crypto.randomUUID(), role: "ROLE_USER", parts: [{ data }], ...(taskId === undefined ? {} : { taskId }) },
    ...(configuration === undefined ? {} : { configuration }),
  });
}

/** The task a send answered (not a Message). */
function taskOf(sent: Task | A2aMessage): Task {
  assert.ok("id" in sent, JSON.stringify(sent));
  return sent;
}

/** A status message's text. */
function question(task: Task): string | undefined {
  const content = task.status?.message?.parts[0]?.content;
  return content?.$case === "text" ? content.value : undefined;
}

for (const binding of ["JSONRPC", "GRPC"] as const) {
  test(`the A2A JavaScript client holds a multi-turn conversation over ${binding}: input-required, then continued`, async (t) => {
    await startAgent(t, stack, shirts());
    const client = await a2aFactory(stack.token("tester"), binding).createFromUrl(`${stack.router.url}/a2a/test.ts_shirt/`);
    const bearer = bearerOf(stack.token("tester"));
    const asked = taskOf(await client.sendMessage(message({ style: "polo" }), bearer));
    assert.equal(asked.status?.state, TaskState.TASK_STATE_INPUT_REQUIRED, JSON.stringify(asked));
    assert.equal(question(asked), "Which size?");
    const more = taskOf(await client.sendMessage(message({ size: "L" }, asked.id), bearer));
    assert.equal(more.id, asked.id, "the same task");
    assert.equal(question(more), "Which color?");
    const done = taskOf(await client.sendMessage(message({ color: "navy" }, asked.id), bearer));
    assert.equal(done.status?.state, TaskState.TASK_STATE_COMPLETED, JSON.stringify(done));
    const output = done.artifacts[0]?.parts[0]?.content;
    assert.deepEqual(output?.$case === "data" ? output.value : output, { style: "polo", size: "L", color: "navy", turns: 4 });
    const history = taskOf(await client.getTask(GetTaskRequest.fromJSON({ id: asked.id, historyLength: 3 }), bearer)).history;
    assert.equal(history.length, 3, JSON.stringify(history));
    // A task that ended takes no further message (spec §3.1.1).
    await assert.rejects(client.sendMessage(message({ color: "red" }, asked.id), bearer), /no further messages|UnsupportedOperation/i);
  });
}

/** An agent whose answer waits until released. */
function held(release: Promise<void>) {
  return makeAgent(stack, { name: "ts_agent", agentId: "ts_agent-held" }).handler(
    { capability: "test.ts_held", input: Order, output: Priced },
    async ({ order_id }) => {
      await release;
      return { order_id, total_cents: 100 };
    },
  );
}

test("the A2A JavaScript client resubscribes to a running task and keeps its push configs", async (t) => {
  let open!: () => void;
  const release = new Promise<void>((resolve) => {
    open = resolve;
  });
  t.after(() => {
    open();
  });
  await startAgent(t, stack, held(release));
  const client: A2aClient = await a2aFactory(stack.token("tester"), "JSONRPC").createFromUrl(`${stack.router.url}/a2a/test.ts_held/`);
  const task = taskOf(await client.sendMessage(message({ order_id: "SO-9" }, undefined, { returnImmediately: true })));
  // Push configs: several per task, each by its id (created, listed, read, deleted).
  for (const id of ["hook-b", "hook-a"]) {
    const created = await client.createTaskPushNotificationConfig(
      TaskPushNotificationConfig.fromJSON({ taskId: task.id, id, url: "http://127.0.0.1:9/hook", token: `t-${id}` }),
    );
    assert.equal(created.id, id);
  }
  const listed = await client.listTaskPushNotificationConfig(ListTaskPushNotificationConfigsRequest.fromJSON({ taskId: task.id }));
  assert.deepEqual(
    listed.configs.map((config) => config.id),
    ["hook-a", "hook-b"],
  );
  const got = await client.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: "hook-b" }));
  assert.equal(got.token, "t-hook-b");
  await client.deleteTaskPushNotificationConfig(DeleteTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: "hook-b" }));
  await assert.rejects(
    client.getTaskPushNotificationConfig(GetTaskPushNotificationConfigRequest.fromJSON({ taskId: task.id, id: "hook-b" })),
    /no push notification config|TaskNotFound/i,
  );
  // Resubscribe while it runs: the task first, then its updates to the end.
  const events: unknown[] = [];
  const following = (async () => {
    for await (const event of client.resubscribeTask(SubscribeToTaskRequest.fromJSON({ id: task.id }))) events.push(event);
  })();
  for (let attempt = 0; attempt < 500 && events.length === 0; attempt += 1) await new Promise((resolve) => setTimeout(resolve, 10));
  assert.match(JSON.stringify(events[0]), /"\$case":"task"/, JSON.stringify(events));
  open();
  await following;
  const seen = JSON.stringify(events);
  assert.match(seen, /"total_cents":100/, seen);
  assert.match(seen, new RegExp(`"state":${String(TaskState.TASK_STATE_COMPLETED)}`), seen);
});

test("the official MCP TypeScript client follows a task from tools/call to its result (2025-11-25)", async (t) => {
  let open!: () => void;
  const release = new Promise<void>((resolve) => {
    open = resolve;
  });
  t.after(() => {
    open();
  });
  await startAgent(t, stack, held(release));
  const transport = new StreamableHTTPClientTransport(new URL(`${stack.router.url}/mcp`), {
    requestInit: { headers: { authorization: `Bearer ${stack.token("tester")}` } },
  });
  const mcp = new McpClient({ name: "agent-reach-test", version: "1.0.0" }, { capabilities: { tasks: {} } });
  await mcp.connect(transport);
  t.after(() => mcp.close());
  const tools = await mcp.listTools();
  const tool = tools.tools.find((listed) => listed.name === "test.ts_held");
  assert.deepEqual(tool?.execution, { taskSupport: "optional" });
  const messages: { type: string; task?: { taskId: string; status: string }; result?: unknown }[] = [];
  const following = (async () => {
    const stream = mcp.experimental.tasks.callToolStream({ name: "test.ts_held", arguments: { order_id: "SO-10" } }, undefined, {
      task: { ttl: 60_000 },
    });
    for await (const message of stream) messages.push(message);
  })();
  for (let attempt = 0; attempt < 500 && messages.length === 0; attempt += 1) await new Promise((resolve) => setTimeout(resolve, 10));
  const created = messages[0];
  assert.equal(created?.type, "taskCreated", JSON.stringify(messages));
  const taskId = created.task?.taskId ?? "";
  assert.match(taskId, /^t_/);
  // The same task under /v1/tasks, by its one id.
  const view = (await (
    await fetch(`${stack.router.url}/v1/tasks/${taskId}`, { headers: { authorization: `Bearer ${stack.token("tester")}` } })
  ).json()) as { capability: string };
  assert.equal(view.capability, "test.ts_held");
  open();
  await following;
  const last = messages[messages.length - 1];
  assert.equal(last?.type, "result", JSON.stringify(messages));
  assert.match(JSON.stringify(last.result), /"total_cents":100/);
});

test("the MCP Inspector's CLI lists and calls a tool", async (t) => {
  await startAgent(t, stack, pricing());
  const inspector = join(REPO, "sdk", "typescript", "node_modules", ".bin", "inspector");
  const run = async (...args: string[]) => {
    const { stdout } = await promisify(execFile)(
      inspector,
      ["--cli", `${stack.router.url}/mcp`, "--transport", "http", "--header", `Authorization: Bearer ${stack.token("tester")}`, ...args],
      { timeout: 60_000, env: { ...process.env, MCP_CATALOG_PATH: join(stack.directory, "mcp-catalog.json") } },
    );
    return stdout;
  };
  const listed = await run("--method", "tools/list");
  assert.match(listed, /"test\.ts_price"/, listed);
  const called = await run("--method", "tools/call", "--tool-name", "test.ts_price", "--tool-arg", "order_id=SO-11", "count=2");
  assert.match(called, /"total_cents":\s*500/, called);
});
