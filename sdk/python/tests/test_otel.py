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
    servers = [span for span in spans if span.name == "agent.invoke"]
    clients = [span for span in spans if span.name == "agent.call"]
    assert len(servers) == 2
    assert len(clients) == 1
    assert {format(span.context.trace_id, "032x") for span in spans} == {trace_id}
    assert {span.attributes["capability"] for span in servers} == {"test.otel.outer", "test.otel.inner"}  # type: ignore[index]
    outer_span = next(span for span in servers if span.attributes["capability"] == "test.otel.outer")  # type: ignore[index]
    assert clients[0].parent is not None
    assert clients[0].parent.span_id == outer_span.context.span_id
