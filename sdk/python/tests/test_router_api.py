"""The router answers as its OpenAPI document says (issue 19): schemathesis, an OpenAPI
fuzzer, reads `GET /v1/openapi.json` from the stack's router (tasks on, a real agent
serving the document's example capability) and sends what the document allows and what
it does not, checking that no answer is a server error and that every status, content
type and body is one the document lists; once with a valid token, once without.

Bounded (a fixed number of examples per operation and phase, a fixed seed so a failure in
CI reproduces); a failure prints schemathesis's report, with a `curl` line per finding.
Change `SEED` locally to explore further.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Stack, wait_until

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: Test cases per operation in the fuzzing phase (the coverage phase adds its own boundary cases).
MAX_EXAMPLES = 30
SEED = 20261201
SUPPORT = Path(__file__).parent / "support"


@pytest.fixture(scope="module")
def summarizer(stack: Stack) -> Iterator[Agent]:
    """The agent behind the document's example (`text.summarize` ^1), so generated calls and
    tasks go all the way to an agent and back."""
    agent = make_agent(stack, agent_id="py_agent-openapi")

    @agent.handler("text.summarize", version="1.0.0")
    def summarize(payload: dict[str, str]) -> dict[str, str]:
        return {"summary": str(payload.get("text", ""))[:40]}

    agent.start(handle_signals=False)
    try:
        agent.mark_ready()
        wait_until(lambda: stack.routable("text.summarize", agent.agent_id), 10, "the example agent routable")
        yield agent
    finally:
        agent.stop(timeout_s=30)


@pytest.mark.parametrize("token", [True, False], ids=["with-token", "without-token"])
def test_every_answer_is_one_the_openapi_document_lists(
    stack: Stack, summarizer: Agent, tmp_path: Path, token: bool
) -> None:
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(SUPPORT / "schemathesis.toml")]
    argv += ["run", f"{stack.router.url}/v1/openapi.json"]
    argv += ["--checks", ",".join([*(check.__name__ for check in CHECKS), "gateway_timeouts_are_deadlines"])]
    argv += ["--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--request-timeout", "30"]
    if token:
        argv += ["--header", f"Authorization: Bearer {stack.token('tester')}"]
    # In a temporary directory: its example database and reports stay out of the repository.
    result = subprocess.run(
        argv,
        cwd=tmp_path,
        env={
            **os.environ,
            "NO_COLOR": "1",
            "COLUMNS": "120",
            "SCHEMATHESIS_HOOKS": "tests.support.fuzz_checks",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT.parents[1]), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-30_000:]
    # Every operation was tried (all but the document itself, which schemathesis leaves out).
    selected = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", report)
    assert selected is not None, report[-5000:]
    assert selected[1] == selected[2] == selected[3], selected[0]
    assert int(selected[1]) >= 11, selected[0]
    if token:
        # The document's example went all the way to the agent, and came back as documented.
        served = _served(summarizer)
        assert served > 0, "no generated call reached the example agent"


def _served(agent: Agent) -> int:
    address = agent.local_address
    assert address is not None
    metrics = httpx.get(f"http://{address[0]}:{address[1]}/metrics").text
    found = re.search(r'agent_reach_agent_requests_total\{capability="text.summarize",code="OK"\} (\d+)', metrics)
    return int(found[1]) if found else 0


def test_an_unknown_query_parameter_is_a_documented_400(stack: Stack) -> None:
    """The issue's example: `?limit=0&x=1` once answered an undocumented 400 coded
    INVALID_ENVELOPE; now 400 INVALID_QUERY, as the document says."""
    schema = schemathesis.openapi.from_url(f"{stack.router.url}/v1/openapi.json")
    operation = schema["/v1/sessions/{session_id}/results"]["GET"]
    case = operation.Case(
        path_parameters={"session_id": "s-1"},
        query={"limit": 0, "x": 1},
        headers={"Authorization": f"Bearer {stack.token('tester')}"},
    )
    response = case.call(base_url=stack.router.url)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "INVALID_QUERY"
    assert "x" in error["message"]
    case.validate_response(response, checks=CHECKS)
    # A cursor that is not one the router handed out (once 503 TASK_STORE_UNAVAILABLE from Redis).
    bad_cursor = httpx.get(
        f"{stack.router.url}/v1/sessions/s-1/results",
        params={"after": ""},
        headers={"authorization": f"Bearer {stack.token('tester')}"},
    )
    assert (bad_cursor.status_code, bad_cursor.json()["error"]["code"]) == (400, "INVALID_QUERY")
