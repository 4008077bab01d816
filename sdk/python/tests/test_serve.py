"""Registration and serving through the real router: schemas, readiness, refusals,
dedup, deadlines, errors, load, health and metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

from agent_reach import Agent, Ctx, HandlerError, RegistrationRefused, Status

from .conftest import make_agent
from .support.stack import Stack, wait_until


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    count: int = Field(default=1, ge=1)


class Echo(BaseModel):
    order_id: str
    count: int
    caller: str | None
    agent_id: str


def echo_agent(stack: Stack, **options: Any) -> Agent:
    agent = make_agent(stack, **options)

    @agent.handler("test.echo", version="1.2.0", timeout_ms=5000)
    async def echo(payload: Order, ctx: Ctx) -> Echo:
        """Echo an order back."""
        return Echo(order_id=payload.order_id, count=payload.count, caller=ctx.source, agent_id=agent.agent_id)

    return agent


def test_registers_with_derived_schemas_and_serves_through_the_router(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = start_agent(echo_agent(stack), ready=False)
    record = stack.instance(agent.agent_id)
    assert record is not None
    assert record["status"] == "starting"
    assert record["name"] == "py_agent"
    assert record["endpoint"].endswith("/invoke")
    (capability,) = record["capabilities"]
    assert capability["name"] == "test.echo"
    assert capability["version"] == "1.2.0"
    assert capability["timeout_ms"] == 5000
    assert capability["description"] == "Echo an order back."
    assert capability["input_schema"]["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert capability["input_schema"]["required"] == ["order_id"]
    assert set(capability["output_schema"]["properties"]) == {"order_id", "count", "caller", "agent_id"}
    # No traffic before mark_ready.
    assert not stack.routable("test.echo", agent.agent_id)

    agent.mark_ready()
    wait_until(lambda: stack.routable("test.echo", agent.agent_id), 10, "ready instance")
    answer = invoke("test.echo", {"order_id": "SO-1", "count": 2}, capability_version="^1.2")
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == "succeeded"
    assert result["agent_id"] == agent.agent_id
    assert result["capability_version"] == "1.2.0"
    assert result["output"] == {"order_id": "SO-1", "count": 2, "caller": "tester", "agent_id": agent.agent_id}


def test_schema_refusal_is_a_422_for_the_caller(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = start_agent(echo_agent(stack))
    # The router checks the schema the SDK derived (and registered) before forwarding.
    answer = invoke("test.echo", {"order_id": 42})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "SCHEMA_MISMATCH"
    assert error["details"]["errors"][0]["pointer"] == "/order_id"
    # The agent validates on its own side too (constraints beyond the schema, direct callers).
    direct = post_direct(stack, agent, {"order_id": "SO"})
    assert direct.status_code == 422
    body = direct.json()["error"]
    assert body["code"] == "SCHEMA_MISMATCH"
    assert body["details"]["errors"][0]["pointer"] == "/order_id"


def post_direct(stack: Stack, agent: Agent, payload: Any, **fields: Any) -> httpx.Response:
    """Posts an envelope straight to the agent, standing in for the router: with an
    assertion signed by the stack's router key, for this agent, caller and capability."""
    address = agent.local_address
    assert address is not None
    headers = fields.pop("headers", {})
    envelope = {
        "version": "1.0",
        "request_id": fields.pop("request_id", f"direct-{time.monotonic_ns()}"),
        "capability": agent.handlers[0].descriptor.capability,
        "capability_version": agent.handlers[0].descriptor.version,
        "source": "tester",
        "priority": "normal",
        "deadline": int(time.time() * 1000) + 10_000,
        "attempt": 1,
        "payload": payload,
    }
    envelope.update(fields)
    assertion = stack.assertion(audience=agent.agent_id, caller=envelope["source"], capability=envelope["capability"])
    headers = {"authorization": f"Bearer {assertion}", **headers}
    return httpx.post(f"http://{address[0]}:{address[1]}/invoke", json=envelope, headers=headers, timeout=30)


def test_a_repeated_request_id_gets_the_first_answer(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)
    runs: list[str] = []
    release = threading.Event()

    @agent.handler("test.count")
    def count(payload: dict[str, Any], ctx: Ctx) -> dict[str, int]:
        runs.append(ctx.request_id)
        release.wait(10)
        return {"run": len(runs)}

    start_agent(agent)
    release.set()
    first = invoke("test.count", {}, request_id="dedup-1")
    again = invoke("test.count", {}, request_id="dedup-1")
    assert first.json()["output"] == again.json()["output"] == {"run": 1}
    assert runs == ["dedup-1"]

    # Concurrent repeats wait for the first delivery instead of running again.
    release.clear()
    answers: list[httpx.Response] = []
    callers = [
        threading.Thread(target=lambda: answers.append(invoke("test.count", {}, request_id="dedup-2")))
        for _ in range(3)
    ]
    for caller in callers:
        caller.start()
    wait_until(lambda: "dedup-2" in runs, 10, "the first delivery running")
    release.set()
    for caller in callers:
        caller.join(30)
    assert [answer.json()["output"] for answer in answers] == [{"run": 2}] * 3
    assert runs.count("dedup-2") == 1


def test_work_past_its_deadline_is_refused(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)
    finished: list[str] = []

    @agent.handler("test.slow")
    async def slow(payload: dict[str, float], ctx: Ctx) -> dict[str, str]:
        await asyncio.sleep(payload["seconds"])
        finished.append(ctx.request_id)
        return {"done": "yes"}

    start_agent(agent)
    # Arrives after its deadline: refused before any work.
    late = post_direct(stack, agent, {"seconds": 0}, deadline=int(time.time() * 1000) - 1)
    assert late.status_code == 504
    assert late.json()["error"]["code"] == "DEADLINE_EXCEEDED"
    # Runs out of time while working: stopped at the deadline.
    answer = invoke("test.slow", {"seconds": 5}, timeout_ms=300, request_id="slow-1")
    assert answer.status_code == 504
    error = answer.json()["error"]
    # Whichever notices first: the router's own timer, or the agent's answer passed through.
    assert "DEADLINE_EXCEEDED" in (error["code"], error.get("details", {}).get("agent_code"))
    assert "slow-1" not in finished


def test_handler_errors_and_exceptions(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)

    @agent.handler("test.fail")
    def fail(payload: dict[str, str]) -> dict[str, str]:
        if payload["how"] == "business":
            raise HandlerError("ORDER_NOT_FOUND", "no order SO-9", status=404)
        if payload["how"] == "output":
            return {"not": 1}  # type: ignore[dict-item]  # the wrong output type, on purpose
        raise ZeroDivisionError("boom")

    start_agent(agent)
    business = invoke("test.fail", {"how": "business"})
    assert business.status_code == 404
    error = business.json()["error"]
    assert (error["code"], error["details"]) == ("AGENT_ERROR", {"agent_status": 404, "agent_code": "ORDER_NOT_FOUND"})
    crash = invoke("test.fail", {"how": "crash"})
    assert crash.status_code == 500
    assert crash.json()["error"]["details"]["agent_code"] == "HANDLER_PANICKED"
    assert "ZeroDivisionError: boom" in crash.json()["error"]["message"]
    output = invoke("test.fail", {"how": "output"})
    assert output.json()["error"]["details"]["agent_code"] == "INVALID_OUTPUT"
    # The agent keeps serving.
    assert invoke("test.fail", {"how": "business"}).status_code == 404


def test_concurrency_limit_answers_503_and_load_is_reported(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    agent = make_agent(stack, max_concurrency=2)
    release = threading.Event()

    @agent.handler("test.block")
    def block(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return {}

    start_agent(agent)
    try:
        holders = [threading.Thread(target=post_direct, args=(stack, agent, {})) for _ in range(2)]
        for holder in holders:
            holder.start()
        wait_until(lambda: agent.inflight == 2, 10, "two deliveries in flight")
        # At the limit: "not now" (the router would try another instance) and overloaded.
        refused = post_direct(stack, agent, {})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "OVERLOADED"
        wait_until(lambda: (stack.instance(agent.agent_id) or {}).get("status") == "overloaded", 10, "overloaded")
        health = httpx.get(f"http://{agent.local_address[0]}:{agent.local_address[1]}/healthz")  # type: ignore[index]
        assert health.status_code == 503
        assert health.json()["inflight"] == 2
    finally:
        release.set()
    wait_until(lambda: (stack.instance(agent.agent_id) or {}).get("status") == "ready", 10, "ready again")
    # Load the SDK cannot see, reported by the application.
    agent.report_load("busy")
    wait_until(lambda: (stack.instance(agent.agent_id) or {}).get("status") == "busy", 10, "busy")
    assert agent.status is Status.BUSY
    agent.report_load(None)
    wait_until(lambda: (stack.instance(agent.agent_id) or {}).get("status") == "ready", 10, "ready")


def test_health_and_metrics(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = start_agent(echo_agent(stack))
    for _ in range(3):
        assert invoke("test.echo", {"order_id": "SO-1"}).status_code == 200
    assert invoke("test.echo", {"order_id": "S"}).status_code == 422  # refused by the router, never delivered
    base = f"http://{agent.local_address[0]}:{agent.local_address[1]}"  # type: ignore[index]
    health = httpx.get(f"{base}/healthz").json()
    assert health["healthy"] is True
    assert health["status"] == "ready"
    text = httpx.get(f"{base}/metrics").text
    assert 'agent_reach_agent_requests_total{capability="test.echo",code="OK"} 3' in text
    assert 'agent_reach_agent_request_duration_seconds_count{capability="test.echo"} 3' in text
    assert 'agent_reach_agent_status{status="ready"} 1' in text


def test_registration_refused_names_the_handler(stack: Stack) -> None:
    agent = make_agent(stack)

    @agent.handler("test.fine")
    def fine(payload: str) -> str:
        return payload

    @agent.handler("secret.thing")
    def not_allowed(payload: str) -> str:
        return payload

    with pytest.raises(RegistrationRefused) as refused:
        agent.start(handle_signals=False)
    assert refused.value.code == "FORBIDDEN"
    assert refused.value.handler is not None
    assert refused.value.handler.endswith("not_allowed")
    assert "handler `" in str(refused.value)
    assert "secret.thing" in str(refused.value)
    assert agent.local_address is None  # nothing left serving


def test_answers_are_not_held_back_by_nagle(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    """Regression: the agent's own listening socket once lacked `proto=IPPROTO_TCP`, so asyncio
    left Nagle on and every answer after a connection's first waited ~40 ms for the router's
    delayed ACK (found by benches/python). Checked on the accepted connection itself."""
    import socket

    agent = start_agent(echo_agent(stack))
    with httpx.Client() as client:
        address = agent.local_address
        assert address is not None
        assert client.get(f"http://{address[0]}:{address[1]}/healthz").status_code == 200
        running = agent._running  # the uvicorn server behind the agent (internal, on purpose)
        assert running is not None
        assert running.server is not None
        connections = list(running.server.server_state.connections)
        assert connections
        for connection in connections:
            sock = connection.transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
