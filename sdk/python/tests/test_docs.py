"""The documentation's examples run as written."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import httpx

from .support.stack import Process, Stack, free_port, wait_until

README = Path(__file__).resolve().parents[1] / "README.md"


def code_block_after(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block after {heading!r}"
    return match.group(1)


def test_the_seeds_example_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    script = tmp_path / "seeds_example.py"
    script.write_text(code_block_after("## From the design notes: `AgentRuntime`"))
    port = free_port()
    env = {
        **stack.agent_env("summarizer"),
        "AGENT_REACH_LISTEN": f"127.0.0.1:{port}",
        "AGENT_REACH_ENDPOINT": f"http://127.0.0.1:{port}",
    }
    process = Process([sys.executable, str(script)], tmp_path / "seeds.log", env)
    try:
        wait_until(lambda: stack.routable("text.summarize", "agent_001"), 30, "agent_001 routable")
        text = "Agent-Reach makes separately deployed AI agents reachable by capability, reliably."
        answer = httpx.post(
            f"{stack.router.url}/v1/invoke",
            json={"capability": "text.summarize", "payload": {"text": text}},
            headers={"authorization": f"Bearer {stack.token('tester')}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"] == {"summary": text[:57] + "..."}
        assert (stack.instance("agent_001") or {})["capabilities"][0]["timeout_ms"] == 15000
        # The script's main thread has ended; the serving thread keeps the process until SIGTERM.
        process.signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.tail()
        assert stack.instance("agent_001") is None
    finally:
        process.stop()
