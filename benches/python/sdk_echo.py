"""The bench's SDK agent: one echo handler, served by `agent.run()` (uvicorn)."""

from __future__ import annotations

import os
from typing import Any

from agent_reach import Agent

# Verification on, as in production: every call's router assertion is checked
# against the router's JWKS (AGENT_REACH_ROUTER); the bare app checks nothing.
agent = Agent(
    "py_agent",
    agent_id="bench_sdk-1",
    max_concurrency=256,
)


@agent.handler(os.environ.get("BENCH_CAPABILITY", "test.echo_sdk"))
async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


if __name__ == "__main__":
    agent.run()
