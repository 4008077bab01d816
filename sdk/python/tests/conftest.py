"""Fixtures: one real stack (etcd, Redis, registry, router, context service) for the
session, and agents started in-process against it, stopped after each test."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agent_reach import Agent

from .support.stack import Stack, wait_until


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    started = Stack()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def start_agent(stack: Stack) -> Iterator[Callable[..., Agent]]:
    """Starts an agent (background thread) against the stack, ready for traffic,
    and waits until the registry resolves it; stops every agent after the test."""
    started: list[Agent] = []

    def start(agent: Agent, *, ready: bool = True) -> Agent:
        agent.start(handle_signals=False)
        started.append(agent)
        if ready:
            agent.mark_ready()
            capability = agent.handlers[0].descriptor.capability
            wait_until(lambda: stack.routable(capability, agent.agent_id), 10, f"{agent.agent_id} routable")
        return agent

    yield start
    for agent in reversed(started):
        agent.stop(timeout_s=30)


def make_agent(stack: Stack, name: str = "py_agent", **options: Any) -> Agent:
    """An agent wired to the stack; it verifies the router's assertions with the keys the
    stack's router publishes (``{router}/.well-known/jwks.json``), as in production."""
    settings: dict[str, Any] = {
        "registry": stack.registry.url,
        "router": stack.router.url,
        "context": stack.context.url,
        "token": stack.token(name),
        "ttl_s": 3,
    }
    settings.update(options)
    return Agent(name, **settings)


@pytest.fixture
def invoke(stack: Stack) -> Callable[..., httpx.Response]:
    """POST /v1/invoke as `tester` (or `caller`)."""

    def call(capability: str, payload: Any, caller: str = "tester", **fields: Any) -> httpx.Response:
        body = {"capability": capability, "payload": payload, **fields}
        headers = {"authorization": f"Bearer {stack.token(caller)}"}
        return httpx.post(f"{stack.router.url}/v1/invoke", json=body, headers=headers, timeout=30)

    return call


@pytest.fixture(autouse=True)
def _sdk_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent_reach")
