"""Every Python snippet of the SDK's README runs, as written, against the real stack.

Each ```python block belongs to the section it is under; every section with one has a
runner here, and a block without a runner fails the suite, so the README cannot grow a
snippet nobody runs. Blocks run as scripts in their own processes, with the links from
the ``AGENT_REACH_*`` environment as in production; the only edits are the addresses a
snippet spells out for a reader (``REPLACED``), each checked to be there.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from agent_reach import Agent

from .support.stack import Process, Stack, free_port, wait_until

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    """(section heading, code) of every ```python block, in order (indented blocks dedented)."""
    blocks: list[tuple[str, str]] = []
    heading: str = ""
    code: list[str] | None = None
    for line in README.read_text().splitlines(keepends=True):
        if code is None:
            if line.startswith("## "):
                heading = line[3:].strip()
            elif line.strip() == "```python":
                code = []
        elif line.strip() == "```":
            blocks.append((heading, textwrap.dedent("".join(code))))
            code = None
        else:
            code.append(line)
    return blocks


def block(heading: str) -> str:
    found = [code for section, code in python_blocks() if section == heading]
    assert len(found) == 1, f"one python block under {heading!r}, found {len(found)}"
    return found[0]


def replaced(code: str, edits: dict[str, str]) -> str:
    """``code`` with each address a reader sees swapped for the stack's (each must be there)."""
    for old, new in edits.items():
        assert old in code, f"the README's snippet no longer says {old!r}: update the doc test"
        code = code.replace(old, new)
    return code


class Script:
    """A README block run as a script, on a port of its own (``endpoint`` is its base URL)."""

    def __init__(
        self, stack: Stack, tmp_path: Path, name: str, code: str, agent: str, port: int | None = None, **env: str
    ) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        path = tmp_path / f"readme_{name}.py"  # never a package's name (`langgraph.py` would shadow it)
        path.write_text(code)
        environment = {
            **stack.agent_env(agent),
            "AGENT_REACH_LISTEN": f"127.0.0.1:{self.port}",
            "AGENT_REACH_ENDPOINT": self.endpoint,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.process = Process([sys.executable, str(path)], tmp_path / f"{name}.log", environment)

    def instance(self, stack: Stack, capability: str) -> dict[str, Any] | None:
        """This script's instance of ``capability`` once the router routes to it."""
        answer = stack.registry_get(f"/v1/capabilities/{capability}")
        if answer.status_code != 200:
            return None
        for instance in answer.json()["instances"]:
            if instance["endpoint"].startswith(self.endpoint) and stack.routable(capability, instance["agent_id"]):
                return dict(instance)
        return None

    def wait_routable(self, stack: Stack, *capabilities: str) -> str:
        for capability in capabilities:
            wait_until(
                lambda capability=capability: self.instance(stack, capability) is not None,  # type: ignore[misc]
                30,
                f"{capability} routable ({self.process.tail()})",
            )
        found = self.instance(stack, capabilities[0])
        assert found is not None
        return str(found["agent_id"])

    def sigterm(self, stack: Stack, agent_id: str) -> None:
        self.process.signal(signal.SIGTERM)
        assert self.process.wait(30) == 0, self.process.tail()
        assert stack.instance(agent_id) is None


@pytest.fixture
def scripts() -> Iterator[list[Script]]:
    started: list[Script] = []
    yield started
    for script in started:
        script.process.stop()


def invoke(stack: Stack, capability: str, payload: Any, caller: str = "tester", **fields: Any) -> httpx.Response:
    body = {"capability": capability, "payload": payload, **fields}
    headers = {"authorization": f"Bearer {stack.token(caller)}"}
    return httpx.post(f"{stack.router.url}/v1/invoke", json=body, headers=headers, timeout=30)


# === The runners, one per section with a block ===


def run_ten_lines(stack: Stack, tmp_path: Path, scripts: list[Script]) -> None:
    port = free_port()
    code = replaced(
        block("An agent in ten lines"),
        {
            'endpoint="http://summarizer-1.internal:8000"': f'endpoint="http://127.0.0.1:{port}"',
            'listen="0.0.0.0:8000"': f'listen="127.0.0.1:{port}"',
        },
    )
    script = Script(stack, tmp_path, "ten_lines", code, "summarizer", port=port)
    scripts.append(script)
    agent_id = script.wait_routable(stack, "text.summarize")
    text = "Agent-Reach makes separately deployed AI agents reachable by capability, " * 3
    answer = invoke(stack, "text.summarize", {"text": text}, capability_version="2.0.0")
    assert answer.json()["output"] == {"summary": text[:100]}, answer.text
    script.sigterm(stack, agent_id)


def run_calls(stack: Stack, tmp_path: Path, scripts: list[Script]) -> None:
    agent = Script(stack, tmp_path, "calls", block("Calling other capabilities and the session context"), "summarizer")
    scripts.append(agent)
    agent_id = agent.wait_routable(stack, "text.summarize", "text.words", "text.report")
    token = {"authorization": f"Bearer {stack.token('tester')}"}
    created = httpx.post(f"{stack.context.url}/v1/contexts", json={"fields": {"user_id": "ada"}}, headers=token)
    context_id = created.json()["context_id"]
    answer = invoke(stack, "text.summarize", {"text": "a b c"}, context_id=context_id)
    output = answer.json()["output"]
    assert (output["summary"], output["words"]) == ("a b c", 3), answer.text
    assert output["context_version"] > created.json()["version"]
    seen = httpx.get(f"{stack.context.url}/v1/contexts/{context_id}", headers=token).json()
    assert seen["fields"]["summary_words"] == 3
    # HandlerError without status= is 422, its code passed through.
    empty = invoke(stack, "text.summarize", {"text": "  "})
    assert empty.status_code == 422, empty.text
    assert empty.json()["error"]["details"] == {"agent_status": 422, "agent_code": "EMPTY_TEXT"}
    metrics = httpx.get(f"{stack.router.url}/metrics").text
    assert (
        'agent_reach_model_tokens_total{capability="text.summarize",model="summarizer-small",type="input"}' in metrics
    )

    # The client program, while the agent serves.
    client = replaced(
        block("Programs that are not agents: `Client` and `AsyncClient`"),
        {'"http://127.0.0.1:7500"': f'"{stack.router.url}"', '"http://127.0.0.1:7600"': f'"{stack.context.url}"'},
    )
    program = Script(stack, tmp_path, "client", client, "tester", AGENT_REACH_TOKEN=stack.token("tester"))
    scripts.append(program)
    assert program.process.wait(60) == 0, program.process.tail()
    printed = program.process.tail(20)
    assert "SCHEMA_MISMATCH" in printed
    assert "'summary': 'MONTHLY'" in printed, printed

    # The LangGraph program: tools of its token, and a graph served as a capability.
    graph = Script(
        stack,
        tmp_path,
        "langgraph",
        block("LangChain and LangGraph: `agent_reach.integrations.langchain`"),
        "assistant",
    )
    scripts.append(graph)
    graph_id = graph.wait_routable(stack, "text.assist")
    assert "['text-summarize']" in graph.process.tail(), graph.process.tail()
    assisted = invoke(stack, "text.assist", {"text": "x y"})
    assert assisted.json()["output"]["summary"]["words"] == 2, assisted.text
    graph.sigterm(stack, graph_id)
    agent.sigterm(stack, agent_id)


def run_mounted(stack: Stack, tmp_path: Path, scripts: list[Script]) -> None:
    namespace: dict[str, Any] = {}
    exec(block("Ways to run"), namespace)  # builds the host app; serving it is `run(app=...)`'s test
    assert isinstance(namespace["app"], Starlette)
    assert namespace["agent"].endpoint == "https://summarizer.internal/agent"


def run_seeds(stack: Stack, tmp_path: Path, scripts: list[Script]) -> None:
    script = Script(stack, tmp_path, "seeds", block("From the design notes: `AgentRuntime`"), "summarizer")
    scripts.append(script)
    wait_until(lambda: stack.routable("text.summarize", "agent_001"), 30, "agent_001 routable")
    text = "Agent-Reach makes separately deployed AI agents reachable by capability, reliably."
    answer = invoke(stack, "text.summarize", {"text": text})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"] == {"summary": text[:57] + "..."}
    assert (stack.instance("agent_001") or {})["capabilities"][0]["timeout_ms"] == 15000
    # The script's main thread has ended; the serving thread keeps the process until SIGTERM.
    script.sigterm(stack, "agent_001")


def run_access(stack: Stack, tmp_path: Path, scripts: list[Script]) -> None:
    summarizer = Agent(
        "summarizer",
        agent_id="summarizer-access",
        registry=stack.registry.url,
        router=stack.router.url,
        token=stack.token("summarizer"),
        ttl_s=3,
    )

    @summarizer.handler("text.summarize")
    def summarize(payload: dict[str, str]) -> dict[str, str]:
        return {"summary": payload["text"][:10]}

    summarizer.start(handle_signals=False)
    try:
        summarizer.mark_ready()
        wait_until(lambda: stack.routable("text.summarize", "summarizer-access"), 30, "text.summarize routable")
        script = Script(stack, tmp_path, "access", block("Asking for access at run time"), "reporter")
        scripts.append(script)
        agent_id = script.wait_routable(stack, "text.brief")
        wait_until(lambda: "access to text.summarize: pending" in script.process.tail(), 30, "the request filed")
        found = re.search(r"pending (ar-[0-9a-f]+) \['owner'\]", script.process.tail())
        assert found, script.process.tail()
        owner = {"authorization": f"Bearer {stack.token('owner')}"}
        approved = httpx.post(f"{stack.registry.url}/v1/access-requests/{found[1]}/approve", headers=owner)
        assert approved.status_code == 200, approved.text
        wait_until(lambda: invoke(stack, "text.brief", {"text": "a long text"}).status_code == 200, 5, "allowed")
        answer = invoke(stack, "text.brief", {"text": "a long text"})
        assert answer.json()["output"] == {"summary": {"summary": "a long tex"}}, answer.text
        script.sigterm(stack, agent_id)
    finally:
        summarizer.stop(timeout_s=30)


RUNNERS: dict[str, Callable[[Stack, Path, list[Script]], None]] = {
    "Asking for access at run time": run_access,
    "An agent in ten lines": run_ten_lines,
    "Calling other capabilities and the session context": run_calls,
    "Programs that are not agents: `Client` and `AsyncClient`": run_calls,
    "Ways to run": run_mounted,
    "From the design notes: `AgentRuntime`": run_seeds,
    "LangChain and LangGraph: `agent_reach.integrations.langchain`": run_calls,
}


def test_every_python_block_of_the_readme_has_a_runner() -> None:
    sections = [heading for heading, _ in python_blocks()]
    assert sections, "no python block found in the README"
    missing = [heading for heading in sections if heading not in RUNNERS]
    assert not missing, f"README sections with a python block no test runs: {missing}"
    stale = [heading for heading in RUNNERS if heading not in sections]
    assert not stale, f"runners for sections without a python block: {stale}"


@pytest.mark.parametrize("runner", sorted(set(RUNNERS.values()), key=lambda runner: runner.__name__))
def test_the_readme_snippets_run_as_written(
    runner: Callable[[Stack, Path, list[Script]], None], stack: Stack, tmp_path: Path, scripts: list[Script]
) -> None:
    runner(stack, tmp_path, scripts)


def test_installing_the_package_leaves_nothing_in_the_checkout(tmp_path: Path) -> None:
    """``pip install ./sdk/python`` builds with flit_core, which writes no ``build/`` beside the sources."""
    package = README.parent
    before = {path.name for path in package.iterdir()}

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(package),
        ],
        check=True,
    )
    assert list(tmp_path.glob("agent_reach-*.whl")), "no wheel built"
    assert {path.name for path in package.iterdir()} == before
