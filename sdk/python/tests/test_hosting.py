"""The agent inside a host ASGI app (the FastAPI/Starlette way), trace context in and
out with and without OpenTelemetry, and request fields on log records."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from agent_reach import Agent, Ctx
from agent_reach.logs import RequestFields

from .conftest import make_agent
from .support.stack import Stack, free_port, wait_until


def test_mounted_in_a_host_app_with_its_lifespan(stack: Stack, invoke: Callable[..., httpx.Response]) -> None:
    port = free_port()
    agent = make_agent(stack, agent_id="py_agent-mounted", endpoint=f"http://127.0.0.1:{port}/agent")

    @agent.handler("test.mounted")
    async def mounted(payload: str) -> str:
        return payload.upper()

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("host app")

    app = Starlette(routes=[Route("/", home), Mount("/agent", app=agent.asgi)], lifespan=agent.lifespan)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: stack.routable("test.mounted", agent.agent_id), 20, "the mounted agent routable")
        assert invoke("test.mounted", "hi").json()["output"] == "HI"
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "host app"
        assert httpx.get(f"http://127.0.0.1:{port}/agent/healthz").json()["healthy"] is True
    finally:
        server.should_exit = True
        thread.join(30)
    assert stack.instance(agent.agent_id) is None  # the host's shutdown drained and deregistered it


def test_run_with_a_host_app_drains_first(stack: Stack, invoke: Callable[..., httpx.Response]) -> None:
    port = free_port()
    agent = make_agent(
        stack,
        agent_id="py_agent-hosted",
        listen=f"127.0.0.1:{port}",
        endpoint=f"http://127.0.0.1:{port}/agent",
    )

    @agent.handler("test.hosted")
    async def hosted(payload: str) -> str:
        return payload[::-1]

    # The host's lifespan names the agent's too: `run(app=...)` manages it, the lifespan defers.
    app = Starlette(routes=[Mount("/agent", app=agent.asgi)], lifespan=agent.lifespan)
    thread = threading.Thread(target=lambda: asyncio.run(agent.serve(app)), daemon=True)
    thread.start()
    try:
        wait_until(lambda: stack.routable("test.hosted", agent.agent_id), 20, "the hosted agent routable")
        assert invoke("test.hosted", "abc").json()["output"] == "cba"
    finally:
        agent.request_stop()
        thread.join(30)
    assert not thread.is_alive()
    assert stack.instance(agent.agent_id) is None


def test_trace_context_and_log_fields(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    agent = make_agent(stack)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    keep.addFilter(RequestFields())
    app_logger = logging.getLogger("my_agent")
    app_logger.addHandler(keep)
    app_logger.setLevel(logging.INFO)

    @agent.handler("test.inner")
    def inner(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        app_logger.info("inner work")  # a sync handler: a worker thread
        return {"trace_id": ctx.trace_id, "traceparent": ctx.traceparent}

    @agent.handler("test.outer")
    async def outer(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        app_logger.info("outer work")
        seen = await ctx.call("test.inner", {})
        return {"outer": ctx.trace_id, "inner": seen["trace_id"], "inner_parent": seen["traceparent"]}

    start_agent(agent)
    trace_id = os.urandom(16).hex()
    incoming = f"00-{trace_id}-{os.urandom(8).hex()}-01"
    answer = httpx.post(
        f"{stack.router.url}/v1/invoke",
        json={"capability": "test.outer", "payload": {}, "request_id": "trace-1", "session_id": "s-trace"},
        headers={"authorization": f"Bearer {stack.token('tester')}", "traceparent": incoming},
        timeout=30,
    ).json()["output"]
    try:
        assert answer["outer"] == answer["inner"] == trace_id
        assert answer["inner_parent"] != incoming  # a new span id in the same trace
        by_message = {record.getMessage(): record for record in records}
        outer_record, inner_record = by_message["outer work"], by_message["inner work"]
        assert (outer_record.trace_id, outer_record.request_id, outer_record.session_id) == (  # type: ignore[attr-defined]
            trace_id,
            "trace-1",
            "s-trace",
        )
        assert inner_record.trace_id == trace_id  # type: ignore[attr-defined]
        assert inner_record.session_id == "s-trace"  # type: ignore[attr-defined]
        assert inner_record.request_id not in ("", "trace-1")  # the inner call's own request id
    finally:
        app_logger.removeHandler(keep)
