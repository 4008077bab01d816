"""A test agent run as its own process (`python worker.py`), the way users run agents:
`agent.run()` on uvicorn, SIGTERM drains it. Links come from the AGENT_REACH_* variables."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from agent_reach import Agent, Ctx
from agent_reach.logs import JsonFormatter, RequestFields

handler = logging.StreamHandler(sys.stderr)
handler.addFilter(RequestFields())
handler.setFormatter(JsonFormatter())
logging.basicConfig(level=logging.INFO, handlers=[handler])

agent = Agent("py_agent", agent_id=os.environ["WORKER_AGENT_ID"], ttl_s=3, max_concurrency=64)


@agent.handler("test.work")
async def work(payload: dict[str, int], ctx: Ctx) -> dict[str, str]:
    await asyncio.sleep(payload.get("ms", 0) / 1000)
    return {"agent_id": agent.agent_id}


if __name__ == "__main__":
    agent.run()
