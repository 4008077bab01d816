// GenAI telemetry and model usage: with OpenTelemetry registered by the application, each
// delivery is an `invoke_agent {capability}` server span (the OpenTelemetry GenAI
// conventions' name and `gen_ai.*` attributes, ours beside them) continuing the router's
// trace, a call onwards is its child, and the usage a handler reports (ctx.reportUsage)
// is on its span and reaches the router's `agent_reach_model_tokens_total`.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";

import { trace } from "@opentelemetry/api";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack } from "./support/stack.js";

let stack: Stack;
const exporter = new InMemorySpanExporter();
before(async () => {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

test("deliveries are invoke_agent spans with the GenAI attributes and the usage reported", async (t) => {
  const agent = makeAgent(stack, { agentId: "ts-otel-1" })
    .handler({ capability: "test.otel.inner", input: z.object({}), output: z.string() }, (_input, ctx) => {
      ctx.reportUsage({ inputTokens: 30, outputTokens: 7, model: "tiny-1" });
      ctx.reportUsage({ inputTokens: 2, outputTokens: 1 });
      return ctx.traceparent?.split("-")[1] ?? "";
    })
    .handler({ capability: "test.otel.outer", input: z.object({}), output: z.string() }, async (_input, ctx) =>
      String(await ctx.call("test.otel.inner", {})),
    );
  await startAgent(t, stack, agent);
  const traceId = randomBytes(16).toString("hex");
  const answer = await fetch(`${stack.router.url}/v1/invoke`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${stack.token("tester")}`,
      traceparent: `00-${traceId}-${randomBytes(8).toString("hex")}-01`,
    },
    body: JSON.stringify({ capability: "test.otel.outer", session_id: "s-otel", payload: {} }),
  });
  const body = (await answer.json()) as { output: string };
  assert.equal(body.output, traceId);

  const spans = exporter.getFinishedSpans();
  const outer = spans.find((span) => span.name === "invoke_agent test.otel.outer");
  const inner = spans.find((span) => span.name === "invoke_agent test.otel.inner");
  assert.ok(outer && inner, `spans: ${spans.map((span) => span.name).join(", ")}`);
  for (const span of [outer, inner]) {
    assert.equal(span.spanContext().traceId, traceId, "the router's trace continues");
    assert.equal(span.attributes["gen_ai.operation.name"], "invoke_agent");
    assert.equal(span.attributes["gen_ai.provider.name"], "agent_reach");
    assert.equal(span.attributes["gen_ai.agent.name"], span.attributes["capability"]);
    assert.equal(span.attributes["gen_ai.agent.id"], "ts-otel-1");
    assert.equal(span.attributes["gen_ai.conversation.id"], "s-otel");
    assert.equal(span.attributes["http.response.status_code"], 200);
  }
  // The inner delivery came through the router from the outer one's call: same trace, and
  // the router's span for it is a child of the outer span (the agent's traceparent).
  assert.notEqual(inner.parentSpanContext?.spanId, outer.spanContext().spanId, "the router sits between them");
  assert.equal(inner.attributes["gen_ai.usage.input_tokens"], 32);
  assert.equal(inner.attributes["gen_ai.usage.output_tokens"], 8);
  assert.equal(inner.attributes["gen_ai.request.model"], "tiny-1");
  assert.equal(outer.attributes["gen_ai.usage.input_tokens"], undefined);
  const metrics = await (await fetch(`${stack.router.url}/metrics`)).text();
  assert.match(metrics, /agent_reach_model_tokens_total\{capability="test\.otel\.inner",model="tiny-1",type="input"\} 32/);
  assert.match(metrics, /agent_reach_model_tokens_total\{capability="test\.otel\.inner",model="tiny-1",type="output"\} 8/);
});

test("usage that is not a count of tokens is refused where it is reported", async (t) => {
  const agent = makeAgent(stack, { agentId: "ts-otel-2" }).handler(
    { capability: "test.otel.bad", input: z.object({}), output: z.string() },
    (_input, ctx) => {
      assert.throws(() => {
        ctx.reportUsage({ inputTokens: -1 });
      }, TypeError);
      assert.throws(() => {
        ctx.reportUsage({ outputTokens: 1.5 });
      }, TypeError);
      ctx.reportUsage({ cost: 0.25 });
      return JSON.stringify(ctx.usage);
    },
  );
  await startAgent(t, stack, agent);
  const answer = await fetch(`${stack.router.url}/v1/invoke`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${stack.token("tester")}` },
    body: JSON.stringify({ capability: "test.otel.bad", payload: {} }),
  });
  const answered = (await answer.json()) as { output: string };
  assert.deepEqual(JSON.parse(answered.output), { cost: 0.25 }, JSON.stringify(answered));
});
