"""Several registries (issue 23, point 5): an agent given several registry URLs uses one at a
time and moves to the next on any failure, as the Rust SDK does (``sdk/src/registries.rs``).
Against real registry processes on one real etcd: a lease granted through one registry is
renewed through another after the first is killed."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from agent_reach import Agent, ConfigError
from agent_reach.registries import Registries, parse_registries

from .conftest import make_agent
from .support.stack import Stack, free_port, wait_until


def ping_agent(stack: Stack, agent_id: str, registry: str | list[str]) -> Agent:
    agent = make_agent(stack, agent_id=agent_id, registry=registry)

    @agent.handler("test.ping")
    def ping(payload: dict[str, str]) -> dict[str, str]:
        return {"agent_id": agent.agent_id}

    return agent


def test_registry_urls_parse_from_a_list_or_commas() -> None:
    assert parse_registries(" http://r1:7400/ , ,http://r2:7400") == ["http://r1:7400", "http://r2:7400"]
    assert parse_registries(["http://r1:7400", "http://r2:7400/"]) == ["http://r1:7400", "http://r2:7400"]
    assert parse_registries(None) == []
    registries = Registries(["http://r1", "http://r2"])
    assert registries.current == "http://r1"
    registries.failed()
    assert registries.current == "http://r2"
    registries.failed()
    assert registries.current == "http://r1"


def test_registry_urls_that_are_not_http_are_refused_at_start() -> None:
    agent = Agent("py_agent", registry="http://ok:7400,ftp://bad", token="t", insecure_accept_unverified=True)

    @agent.handler("test.ping")
    def ping(payload: dict[str, str]) -> dict[str, str]:
        return payload

    with pytest.raises(ConfigError, match="registry must be an http:// or https:// URL, not `ftp://bad`"):
        agent.start(handle_signals=False)


def test_an_unreachable_first_registry_is_skipped(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    agent = start_agent(ping_agent(stack, "py_agent-skip", f"{dead},{stack.registry.url}"))
    assert agent.is_registered


def test_the_lease_is_renewed_through_the_other_registry_when_one_dies(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    second = stack.start_registry()
    try:
        agent = start_agent(ping_agent(stack, "py_agent-failover", [second.url, stack.registry.url]))
        before = stack.instance(agent.agent_id)
        assert before is not None
        running = agent._running
        assert running is not None
        assert running.lifecycle.registry == second.url
        second.stop()
        killed_at = time.monotonic()
        # The next heartbeat fails on the dead registry and goes to the live one at once.
        wait_until(lambda: running.lifecycle.registry == stack.registry.url, 10, "moving to the live registry")
        wait_until(
            lambda: (running.state.last_heartbeat or 0) > killed_at, 10, "a heartbeat acknowledged by the live registry"
        )
        # That heartbeat renewed the lease granted through the dead registry (both share etcd):
        # the same lease, not a new registration, and the agent serves calls.
        after = stack.instance(agent.agent_id)
        assert after is not None
        assert after["lease_id"] == before["lease_id"], (before, after)
        answer = invoke("test.ping", {})
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"] == {"agent_id": agent.agent_id}
    finally:
        second.stop()
