"""The worked example across languages: Rust `order_query` calls the Python
`shipping.rules` (examples/shipping_rules.py), which calls the Rust `reply.write`
back, all in one trace: every hop reports the trace id it saw."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from .support.stack import REPO, Process, Stack, cargo_binary, wait_until


def test_a_rust_agent_calls_a_python_one_and_back_in_one_trace(stack: Stack, tmp_path: Path) -> None:
    binary = cargo_binary("example-agent", "agent-reach-examples")
    processes: list[Process] = []
    try:
        for name in ("intent_parser", "order_query", "reply_writer"):
            argv = [binary, "--agent", name, "--agent-id", f"{name}-rs"]
            argv += ["--registry", stack.registry.url, "--router", stack.router.url, "--context", stack.context.url]
            argv += ["--token", stack.token(name)]
            processes.append(Process(argv, tmp_path / f"{name}.log"))
        env = {
            **stack.agent_env("shipping_rules"),
        }
        example = REPO / "sdk" / "python" / "examples" / "shipping_rules.py"
        processes.append(
            Process([sys.executable, str(example), "--agent-id", "shipping_rules-py"], tmp_path / "shipping.log", env)
        )
        for capability, agent_id in (
            ("intent.parse", "intent_parser-rs"),
            ("order.query", "order_query-rs"),
            ("shipping.rules", "shipping_rules-py"),
            ("reply.write", "reply_writer-rs"),
        ):
            wait_until(lambda c=capability, a=agent_id: stack.routable(c, a), 30, f"{agent_id} routable")

        headers = {"authorization": f"Bearer {stack.token('demo_user')}"}
        created = httpx.post(f"{stack.context.url}/v1/contexts", json={"tier": "one_shot"}, headers=headers)
        assert created.status_code == 201, created.text
        trace_id = os.urandom(16).hex()
        answer = httpx.post(
            f"{stack.router.url}/v1/invoke",
            headers={**headers, "traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"},
            json={
                "capability": "intent.parse",
                "session_id": "session-ada",
                "context_id": created.json()["context_id"],
                "timeout_ms": 10_000,
                "payload": {"user_id": "ada", "text": "Can my order SO-2024001 ship today?"},
            },
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        chain = answer.json()["output"]
        assert chain["ships_today"] is True
        assert chain["reply"].startswith("Hi ada, good news: order SO-2024001 ships today")
        hops = [(hop["capability"], hop["agent_id"]) for hop in chain["trace"]]
        assert hops == [
            ("order.query", "order_query-rs"),
            ("shipping.rules", "shipping_rules-py"),
            ("reply.write", "reply_writer-rs"),
        ]
        # One trace: the caller's, seen by the Rust agents before and after the Python one.
        assert chain["trace_id"] == trace_id
        assert {hop["trace_id"] for hop in chain["trace"]} == {trace_id}
    finally:
        for process in processes:
            process.stop()
