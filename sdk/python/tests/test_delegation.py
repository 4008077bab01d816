"""Delegation chains and budgets (issue 39) with Python agents on the real router: a
three-agent chain knows whom it acts for; a forged or borrowed upstream is not believed;
``via:`` and ``subjects:`` rules; the trail records the chain; a loop and a chain deeper
than ``--max-depth`` stop with their codes; a budget of 5 calls across a fan-out tree
admits exactly 5; reported cost is subtracted and what is left is visible."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx

from agent_reach import Agent, Ctx
from agent_reach.errors import AgentReachError

from .conftest import make_agent
from .support.stack import Stack, wait_until


def outcome(call: Callable[[], Any]) -> Any:
    """Runs an onward call; its output and budget, or its error as a dict."""

    async def run() -> dict[str, Any]:
        try:
            result = await call()
        except AgentReachError as error:
            return {"code": error.code, "status": error.status, "details": error.details}
        return {"output": result.output, "budget": result.budget}

    return run()


def seen(ctx: Ctx) -> dict[str, Any]:
    return {"chain": list(ctx.chain), "on_behalf_of": ctx.on_behalf_of, "budget": ctx.budget}


def post(stack: Stack, caller: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{stack.router.url}/v1/invoke",
        json={"payload": {}, "timeout_ms": 10_000, **body},
        headers={"authorization": f"Bearer {stack.token(caller)}", **(headers or {})},
        timeout=30,
    )


def deepest(answer: Any) -> Any:
    while isinstance(answer, dict) and ("next" in answer or "next" in (answer.get("output") or {})):
        answer = answer["next"] if "next" in answer else answer["output"]["next"]
    return answer


def test_a_three_agent_chain_knows_whom_it_acts_for(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    first, middle, last = (
        make_agent(stack, "chain_first", agent_id="chain_first-py"),
        make_agent(stack, "chain_middle", agent_id="chain_middle-py"),
        make_agent(stack, "chain_last", agent_id="chain_last-py"),
    )

    @first.handler("test.chain.first")
    async def on_first(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        return {**seen(ctx), "next": await outcome(lambda: ctx.call_envelope("test.chain.middle", {}))}

    @middle.handler("test.chain.middle")
    async def on_middle(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        return {**seen(ctx), "next": await outcome(lambda: ctx.call_envelope("test.chain.last", {}))}

    @last.handler("test.chain.last")
    async def on_last(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        return seen(ctx)

    for agent in (first, middle, last):
        start_agent(agent)

    answer = post(stack, "py_alice", {"capability": "test.chain.first", "session_id": "py-chain"})
    assert answer.status_code == 200, answer.text
    at_first = answer.json()["output"]
    at_middle = at_first["next"]["output"]
    at_last = at_middle["next"]["output"]
    assert at_first["chain"] == ["py_alice"]
    assert at_middle["chain"] == ["py_alice", "chain_first"]
    assert at_last["chain"] == ["py_alice", "chain_first", "chain_middle"]
    assert {hop["on_behalf_of"] for hop in (at_first, at_middle, at_last)} == {"py_alice"}

    # `via: [chain_first]`: chain_middle may not call test.chain.last on its own.
    direct = post(stack, "chain_middle", {"capability": "test.chain.last"})
    assert (direct.status_code, direct.json()["error"]["code"]) == (403, "FORBIDDEN")

    # `subjects: [py_alice]`: a chain begun by py_bob stops at chain_first's onward call.
    by_bob = post(stack, "py_bob", {"capability": "test.chain.first"})
    assert by_bob.status_code == 200, by_bob.text
    refused = by_bob.json()["output"]["next"]
    assert (refused["code"], refused["status"]) == ("FORBIDDEN", 403)
    assert refused["details"]["chain"] == ["py_bob", "chain_first"]

    # Upstreams not believed: made up, or the router's own assertion given to another agent.
    borrowed = stack.assertion(audience="chain_first-py", caller="py_alice", capability="test.chain.first")
    for upstream, reason in (("made-up", "upstream_invalid"), (borrowed, "upstream_not_yours")):
        forged = post(stack, "chain_middle", {"capability": "test.chain.last"}, {"agent-reach-upstream": upstream})
        error = forged.json()["error"]
        assert (forged.status_code, error["code"], error["details"]["reason"]) == (401, "UNAUTHENTICATED", reason)
    # The same assertion presented by the agent it was given to is believed.
    believed = post(stack, "chain_first", {"capability": "test.chain.middle"}, {"agent-reach-upstream": borrowed})
    assert believed.status_code == 200, believed.text
    assert believed.json()["output"]["chain"] == ["py_alice", "chain_first"]

    # The trail records each hop's chain.
    records: list[dict[str, Any]] = []

    def trail_has_the_chain() -> bool:
        nonlocal records
        page = httpx.get(
            f"{stack.router.url}/v1/trail",
            params={"session_id": "py-chain"},
            headers={"authorization": f"Bearer {stack.token('py_auditor')}"},
        )
        records = page.json().get("records", [])
        return {record["capability"] for record in records} >= {"test.chain.first", "test.chain.last"}

    wait_until(trail_has_the_chain, 10, "the trail's records of the chain")
    chains = {record["capability"]: record.get("chain") for record in records}
    assert chains["test.chain.first"] is None
    assert chains["test.chain.middle"] == ["py_alice", "chain_first"]
    assert chains["test.chain.last"] == ["py_alice", "chain_first", "chain_middle"]


def test_loops_chains_too_deep_and_budgets_stop(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    runs: dict[str, int] = {}
    lock = threading.Lock()

    def counted(name: str) -> None:
        with lock:
            runs[name] = runs.get(name, 0) + 1

    def relay() -> Agent:
        agent = make_agent(stack, "chain_relay", agent_id="chain_relay-py")

        @agent.handler("test.chain.ping")
        async def ping(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
            counted("ping")
            return {"next": await outcome(lambda: ctx.call_envelope("test.chain.pong", {}))}

        @agent.handler("test.chain.pong")
        async def pong(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
            counted("pong")
            return {"next": await outcome(lambda: ctx.call_envelope("test.chain.ping", {}))}

        @agent.handler("test.chain.fan_root")
        async def fan_root(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
            counted("fan")
            calls = [await outcome(lambda: ctx.call_envelope("test.chain.fan_mid", {})) for _ in range(3)]
            return {"seen": seen(ctx), "calls": calls}

        @agent.handler("test.chain.fan_mid")
        async def fan_mid(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
            counted("fan")
            leaf = "test.chain.fan_leaf"
            calls = await asyncio.gather(*(outcome(lambda: ctx.call_envelope(leaf, {})) for _ in range(3)))
            return {"calls": list(calls)}

        @agent.handler("test.chain.fan_leaf")
        async def fan_leaf(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
            counted("fan")
            ctx.report_usage(cost=10)
            return {"seen": seen(ctx)}

        return agent

    start_agent(relay())

    # ping → pong → ping on the same instance: a loop, stopped after two runs.
    looped = post(stack, "py_alice", {"capability": "test.chain.ping"})
    assert looped.status_code == 200, looped.text
    refusal = deepest(looped.json())
    assert (refusal["code"], refusal["status"]) == ("LOOP_DETECTED", 403), looped.text
    assert (runs.get("ping"), runs.get("pong")) == (1, 1)

    # A budget of 5 calls over a tree of 13: exactly 5 handler runs, the rest BUDGET_EXHAUSTED.
    fanned = post(stack, "py_alice", {"capability": "test.chain.fan_root", "budget": {"calls": 5, "cost": 1000}})
    assert fanned.status_code == 200, fanned.text
    assert runs["fan"] == 5
    body = fanned.json()
    codes = [call.get("code") for call in body["output"]["calls"] if "code" in call]
    assert codes, body
    assert set(codes) == {"BUDGET_EXHAUSTED"}, body
    assert body["output"]["seen"]["budget"] == {"calls_left": 4, "cost_left": 1000.0}
    # Three leaves reported 10 each.
    assert body["budget"] == {"calls_left": 0, "cost_left": 970.0}, body

    # --max-depth 2 on another router: deep_a → deep_b is the limit there, deep_c is refused.
    key = str(stack.directory / "assertion.pem")
    deep = stack.start_router(["--max-depth", "2", "--assertion-key", key])
    try:
        agent = make_agent(stack, "chain_relay", agent_id="chain_relay-deep-py", router=deep.url)

        def hop(name: str, onward: str | None) -> Callable[[dict[str, Any], Ctx], Any]:
            async def run(payload: dict[str, Any], ctx: Ctx) -> Any:
                counted(name)
                if onward is None:
                    return {"chain": list(ctx.chain)}
                return {"next": await outcome(lambda: ctx.call_envelope(f"test.chain.{onward}", {}))}

            return run

        for name, onward in (("deep_a", "deep_b"), ("deep_b", "deep_c"), ("deep_c", None)):
            agent.handler(f"test.chain.{name}")(hop(name, onward))
        start_agent(agent)
        answers: list[httpx.Response] = []

        def answered() -> bool:
            answers.append(
                httpx.post(
                    f"{deep.url}/v1/invoke",
                    json={"capability": "test.chain.deep_a", "payload": {}, "timeout_ms": 10_000},
                    headers={"authorization": f"Bearer {stack.token('py_alice')}"},
                    timeout=30,
                )
            )
            return answers[-1].status_code == 200

        wait_until(answered, 10, "the router with --max-depth 2 routes test.chain.deep_a")
        refusal = deepest(answers[-1].json())
        assert (refusal["code"], refusal["details"]["depth"], refusal["details"]["max_depth"]) == (
            "DEPTH_EXCEEDED",
            3,
            2,
        ), answers[-1].text
        assert (runs.get("deep_a"), runs.get("deep_b"), runs.get("deep_c")) == (1, 1, None)
    finally:
        deep.stop()
