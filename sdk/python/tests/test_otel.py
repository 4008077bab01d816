"""With OpenTelemetry configured, deliveries are server spans continuing the router's
trace and calls are client spans. (It sets the process's tracer provider; tests after it
run with spans on, which changes nothing they check.)"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_reach import Agent, Ctx

from .conftest import make_agent
from .support.stack import Stack


def test_spans_continue_the_routers_trace(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    agent = make_agent(stack)

    @agent.handler("test.otel.inner")
    async def inner(payload: dict[str, Any], ctx: Ctx) -> str:
        ctx.report_usage(input_tokens=30, output_tokens=7, model="tiny-1")
        ctx.report_usage(input_tokens=2, output_tokens=1)
        return ctx.trace_id or ""

    @agent.handler("test.otel.outer")
    async def outer(payload: dict[str, Any], ctx: Ctx) -> str:
        return str(await ctx.call("test.otel.inner", {}))

    start_agent(agent)
    trace_id = os.urandom(16).hex()
    answer = httpx.post(
        f"{stack.router.url}/v1/invoke",
        json={"capability": "test.otel.outer", "payload": {}},
        headers={
            "authorization": f"Bearer {stack.token('tester')}",
            "traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01",
        },
        timeout=30,
    )
    assert answer.json()["output"] == trace_id
    spans = exporter.get_finished_spans()
    # The OpenTelemetry GenAI conventions' names and attributes, ours beside them.
    servers = [span for span in spans if span.name.startswith("invoke_agent ")]
    clients = [span for span in spans if span.name == "agent.call"]
    assert len(servers) == 2
    assert len(clients) == 1
    assert {format(span.context.trace_id, "032x") for span in spans} == {trace_id}
    assert {span.name for span in servers} == {"invoke_agent test.otel.outer", "invoke_agent test.otel.inner"}
    for span in servers:
        attributes = dict(span.attributes or {})
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["gen_ai.provider.name"] == "agent_reach"
        assert attributes["gen_ai.agent.name"] == attributes["capability"]
        assert attributes["gen_ai.agent.id"] == agent.agent_id
    outer_span = next(span for span in servers if span.name == "invoke_agent test.otel.outer")
    inner_span = next(span for span in servers if span.name == "invoke_agent test.otel.inner")
    assert clients[0].parent is not None
    assert clients[0].parent.span_id == outer_span.context.span_id
    # The usage the inner handler reported (two reports, added up) is on its span.
    reported = dict(inner_span.attributes or {})
    assert (reported["gen_ai.usage.input_tokens"], reported["gen_ai.usage.output_tokens"]) == (32, 8)
    assert reported["gen_ai.request.model"] == "tiny-1"
    assert "gen_ai.usage.input_tokens" not in dict(outer_span.attributes or {})
    # ... and reached the router, which counts it by capability, model and type.
    metrics = httpx.get(f"{stack.router.url}/metrics", timeout=5).text
    assert 'agent_reach_model_tokens_total{capability="test.otel.inner",model="tiny-1",type="input"} 32' in metrics
    assert 'agent_reach_model_tokens_total{capability="test.otel.inner",model="tiny-1",type="output"} 8' in metrics
