"""The caller side: synchronous invoke with typed errors, an agent calling another
capability, durable tasks with results by session, and callback signatures."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Callable

import httpx
import pytest

from agent_reach import (
    Agent,
    AgentError,
    AsyncClient,
    CapabilityNotFound,
    Client,
    Ctx,
    Forbidden,
    HandlerError,
    SchemaMismatch,
    Unauthenticated,
    verify_callback,
)
from agent_reach.wire import new_request_id

from .conftest import make_agent
from .support.stack import Stack


def test_typed_errors_and_calls_between_agents(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    agent = make_agent(stack)

    @agent.handler("test.double")
    async def double(payload: int) -> int:
        if payload < 0:
            raise HandlerError("NEGATIVE", "only non-negative numbers")
        return payload * 2

    @agent.handler("test.quadruple")
    async def quadruple(payload: int, ctx: Ctx) -> int:
        # Through the router, carrying this request's deadline, session and trace.
        twice = await ctx.call("test.double", payload, version="^1", output=int)
        return await ctx.call("test.double", twice, output=int)

    start_agent(agent)
    with Client(router=stack.router.url, token=stack.token("tester")) as client:
        assert client.invoke("test.quadruple", 5).output == 20
        with pytest.raises(AgentError) as failure:
            client.invoke("test.quadruple", -1)
        # The inner failure's code travels up the chain.
        assert failure.value.agent_code == "AGENT_ERROR"
        with pytest.raises(SchemaMismatch):
            client.invoke("test.double", "five")
        with pytest.raises(CapabilityNotFound):
            client.invoke("test.nothing", 1)
    with Client(router=stack.router.url, token=stack.token("stranger")) as client, pytest.raises(Forbidden):
        client.invoke("test.double", 1)
    with Client(router=stack.router.url, token="not-a-token") as client, pytest.raises(Unauthenticated) as refused:
        client.invoke("test.double", 1)
    assert refused.value.details["reason"] == "malformed"


def test_tasks_and_results_by_session(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    agent = make_agent(stack)

    @agent.handler("test.task")
    async def task(payload: dict[str, str]) -> dict[str, str]:
        return {"done": payload["name"]}

    start_agent(agent)

    async def scenario() -> None:
        async with AsyncClient(router=stack.router.url, token=stack.token("tester")) as client:
            session = f"session-{time.monotonic_ns()}"
            accepted = await client.submit_task(
                "test.task", {"name": "a"}, session_id=session, request_id=f"{session}-1"
            )
            assert accepted.status == "pending"
            again = await client.submit_task("test.task", {"name": "a"}, session_id=session, request_id=f"{session}-1")
            assert again.duplicate
            assert again.task_id == accepted.task_id
            view = await client.wait_task(accepted.task_id, timeout_s=20)
            assert view.status == "succeeded"
            assert view.output() == {"done": "a"}
            page = await client.session_results(session)
            assert [entry.task_id for entry in page.results] == [accepted.task_id]
            assert page.next_after is not None
            later = await client.session_results(session, after=page.next_after)
            assert later.results == []

    asyncio.run(scenario())


def test_callback_signatures_verify() -> None:
    secret, body, now = b"s" * 32, b'{"status":"succeeded"}', 1_700_000_000
    signature = hmac.new(secret, f"{now}.".encode() + body, hashlib.sha256).hexdigest()
    header = f"t={now},v1={signature}"
    assert verify_callback(secret, header, body, now=now)
    assert not verify_callback(secret, header, body + b" ", now=now)
    assert not verify_callback(b"x" * 32, header, body, now=now)
    assert not verify_callback(secret, header, body, now=now + 3600)  # a replay
    assert not verify_callback(secret, "v1=zz", body, now=now)


def test_request_ids_are_made_as_the_router_makes_them() -> None:
    before = time.time_ns() // 1_000_000
    first, second = new_request_id(), new_request_id()
    after = time.time_ns() // 1_000_000
    for made in (first, second):
        assert len(made) == 28, made
        assert all(c in "0123456789abcdef" for c in made), made
        assert before <= int(made[:12], 16) <= after, made
    assert first[12:] != second[12:]


def test_unreachable_router_is_a_transport_error() -> None:
    from agent_reach import TransportError

    with Client(router="http://127.0.0.1:9", token="t") as client, pytest.raises(TransportError) as failure:
        client.invoke("test.double", 1)
    assert failure.value.code == "ROUTER_UNREACHABLE"
    assert failure.value.retryable
    assert isinstance(failure.value.__cause__, httpx.HTTPError)
