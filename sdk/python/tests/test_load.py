"""Load reporting and call options, as the Rust SDK does them (issue 21, points 5 and 8):
the thresholds' arithmetic, the heartbeat's in-flight count reaching the registry
record (the fewest in flight over the interval, not a sampled instant), and a
handler's calls carrying its request's priority unless told otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent_reach import Agent, Ctx, LoadThresholds

from .conftest import make_agent
from .support.stack import Stack, wait_until


@pytest.mark.parametrize(
    ("thresholds", "limit", "expected"),
    [
        (LoadThresholds(), 256, (192, 244)),
        (LoadThresholds(busy=0.5, overloaded=1.0), 4, (2, 4)),
        (LoadThresholds(busy=0.07, overloaded=0.07), 100, (7, 7)),
        (LoadThresholds(busy=0.1, overloaded=0.2), 1, (1, 1)),
    ],
)
def test_thresholds_begin_where_the_rust_sdk_says(
    thresholds: LoadThresholds, limit: int, expected: tuple[int, int]
) -> None:
    # The Rust SDK's `LoadThresholds::at` gives the same pairs (sdk/src/state.rs doc test).
    assert thresholds.at(limit) == expected


def test_nonsensical_thresholds_are_named() -> None:
    assert LoadThresholds(busy=0.9, overloaded=0.5).problems() == [
        "load thresholds need 0 < busy (0.9) <= overloaded (0.5) <= 1"
    ]


def _record(stack: Stack, agent_id: str) -> tuple[str, int]:
    instance = stack.instance(agent_id) or {}
    return str(instance.get("status", "")), int(instance.get("inflight", 0))


def test_heartbeats_carry_the_sustained_inflight_count_to_the_registry(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack, max_concurrency=8)
    release = threading.Event()

    @agent.handler("test.hold")
    def hold(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(20)
        return {}

    start_agent(agent)
    held: list[httpx.Response] = []
    callers = [
        threading.Thread(target=lambda: held.append(invoke("test.hold", {}, timeout_ms=30_000))) for _ in range(3)
    ]
    try:
        for caller in callers:
            caller.start()
        wait_until(lambda: agent.inflight == 3, 10, "three deliveries in flight")
        # 3 of 8 is under the busy threshold (6): still ready, its load beside it.
        wait_until(lambda: _record(stack, agent.agent_id) == ("ready", 3), 10, "inflight 3 in the record")
    finally:
        release.set()
        for caller in callers:
            caller.join(30)
    assert [response.status_code for response in held] == [200, 200, 200]
    wait_until(lambda: _record(stack, agent.agent_id) == ("ready", 0), 10, "inflight 0 in the record")


def test_calls_carry_the_requests_priority_unless_given(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)

    @agent.handler("test.relay")
    async def relay(payload: dict[str, Any], ctx: Ctx) -> Any:
        return await ctx.call("test.priority", {}, priority=payload.get("priority"), version="^1")

    @agent.handler("test.priority", version="1.0.0")
    async def priority(payload: dict[str, Any], ctx: Ctx) -> str:
        return str(ctx.priority)

    start_agent(agent)
    wait_until(lambda: stack.routable("test.priority", agent.agent_id), 10, "test.priority routable")

    def relayed(body: dict[str, Any], **fields: Any) -> Any:
        answer = invoke("test.relay", body, timeout_ms=10_000, **fields)
        assert answer.status_code == 200, answer.text
        return answer.json()["output"]

    assert relayed({}, priority="low") == "low"
    assert relayed({"priority": "high"}, priority="low") == "high"
    assert relayed({}) == "normal"
