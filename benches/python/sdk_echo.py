"""The bench's SDK agent: one echo handler, served by `agent.run()` (uvicorn)."""

from __future__ import annotations

import os
from typing import Any

from agent_reach import Agent

# The router does not sign hop assertions yet (issue 20): nothing to verify.
agent = Agent(
    "py_agent",
    agent_id="bench_sdk-1",
    max_concurrency=256,
    insecure_accept_unverified=True,
)


@agent.handler(os.environ.get("BENCH_CAPABILITY", "test.echo_sdk"))
async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


if __name__ == "__main__":
    agent.run()
