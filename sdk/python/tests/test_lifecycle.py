"""Liveness against the real registry and etcd: re-registration after the lease is
lost, surviving a registry restart, and draining on SIGTERM under load."""

from __future__ import annotations

import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Process, Stack, json_lines, wait_until

HERE = Path(__file__).parent


def ping_agent(stack: Stack, agent_id: str) -> Agent:
    agent = make_agent(stack, agent_id=agent_id)

    @agent.handler("test.ping")
    def ping(payload: dict[str, str]) -> dict[str, str]:
        return {"agent_id": agent.agent_id}

    return agent


def test_registers_again_after_the_lease_is_revoked(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = start_agent(ping_agent(stack, "py_agent-lease"))
    before = stack.instance(agent.agent_id)
    assert before is not None
    stack.etcd.revoke_lease(before["lease_id"])
    # The revoked lease took the record with it; the next heartbeat (TTL/3 = 1 s) finds
    # LEASE_EXPIRED and the SDK registers again, as ready, by itself.
    wait_until(
        lambda: (stack.instance(agent.agent_id) or {}).get("lease_id") not in (None, before["lease_id"]),
        15,
        "a new registration",
    )
    wait_until(lambda: stack.routable("test.ping", agent.agent_id), 10, "routable again")
    assert invoke("test.ping", {}).json()["output"] == {"agent_id": agent.agent_id}
    assert agent.is_registered


def test_survives_a_registry_restart(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = start_agent(ping_agent(stack, "py_agent-restart"))
    stack.registry.restart()  # SIGKILL, then the same port: heartbeats fail meanwhile
    wait_until(lambda: stack.routable("test.ping", agent.agent_id), 20, "routable after the restart")
    wait_until(lambda: invoke("test.ping", {}).status_code == 200, 20, "served after the restart")
    assert invoke("test.ping", {}).json()["output"] == {"agent_id": agent.agent_id}
    wait_until(lambda: agent.is_registered, 10, "heartbeats acknowledged again")


def test_sigterm_drains_with_zero_failed_calls_under_load(stack: Stack, tmp_path: Path) -> None:
    def worker(agent_id: str) -> Process:
        env = {
            **stack.agent_env("py_agent"),
            "WORKER_AGENT_ID": agent_id,
        }
        return Process([sys.executable, str(HERE / "agents" / "worker.py")], tmp_path / f"{agent_id}.log", env)

    leaving, staying = worker("py_agent-leaving"), worker("py_agent-staying")
    try:
        for _process, agent_id in ((leaving, "py_agent-leaving"), (staying, "py_agent-staying")):
            wait_until(lambda a=agent_id: stack.routable("test.work", a), 20, f"{agent_id} routable")
        served: Counter[str] = Counter()
        failures: list[str] = []
        stop = threading.Event()
        token = stack.token("tester")

        def load() -> None:
            with httpx.Client(timeout=30) as client:
                # Bounded: at most 2,000 calls per caller, and the test stops it sooner.
                for _ in range(2000):
                    if stop.is_set():
                        return
                    answer = client.post(
                        f"{stack.router.url}/v1/invoke",
                        json={"capability": "test.work", "payload": {"ms": 30}},
                        headers={"authorization": f"Bearer {token}"},
                    )
                    body = answer.json()
                    if body.get("status") == "succeeded":
                        served[body["output"]["agent_id"]] += 1
                    else:
                        failures.append(answer.text)

        callers = [threading.Thread(target=load) for _ in range(8)]
        for caller in callers:
            caller.start()
        wait_until(lambda: served["py_agent-leaving"] >= 20, 30, "load on the leaving instance")
        leaving.signal(signal.SIGTERM)
        assert leaving.wait(30) == 0, leaving.tail()
        after_exit = served["py_agent-staying"]
        wait_until(lambda: served["py_agent-staying"] >= after_exit + 50, 30, "load carried by the other instance")
        stop.set()
        for caller in callers:
            caller.join(30)

        assert failures == [], failures[:3]
        assert stack.instance("py_agent-leaving") is None  # deregistered, not left to expire
        lines = {line.get("message"): line for line in json_lines(leaving.log)}
        assert "Draining." in lines
        # Work in flight at SIGTERM finished before deregistration, the server stopped after.
        assert lines["Drained: no delivery in flight."]["inflight"] == 0
        assert "Deregistered." in lines
    finally:
        leaving.stop()
        staying.stop()
