"""The Python SDK's conformance agent (sdk/contract/README.md): what every SDK's agent
serves, for the one contract driver (sdk/contract/driver.py, run by test_contract.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from pydantic import BaseModel

from agent_reach import Agent, Ctx, HandlerError


class Text(BaseModel):
    text: str


class Echoed(BaseModel):
    text: str
    runs: int


class Sleep(BaseModel):
    ms: int


class Slept(BaseModel):
    slept: int


class Count(BaseModel):
    n: int


class Item(BaseModel):
    i: int


class Served(BaseModel):
    agent_id: str


agent = Agent("contract_agent", agent_id=os.environ["CONTRACT_AGENT_ID"], ttl_s=3)
unavailable = os.environ.get("CONTRACT_UNAVAILABLE") == "1"
runs = 0


@agent.handler("test.contract.echo")
async def echo(payload: Text) -> Echoed:
    global runs
    runs += 1
    return Echoed(text=payload.text, runs=runs)


@agent.handler("test.contract.slow")
async def slow(payload: Sleep) -> Slept:
    await asyncio.sleep(payload.ms / 1000)
    return Slept(slept=payload.ms)


@agent.handler("test.contract.flaky")
async def flaky(payload: dict[str, str]) -> Served:
    if unavailable:
        raise HandlerError.unavailable("this instance is not taking work")
    return Served(agent_id=agent.agent_id)


@agent.handler("test.contract.count")
async def count(payload: Count) -> AsyncIterator[Item]:
    for i in range(payload.n):
        yield Item(i=i)


@agent.handler("test.contract.task")
async def task(payload: Text, ctx: Ctx) -> Text:
    async def work() -> Text:
        await asyncio.sleep(0.05)
        return Text(text=payload.text.upper())

    return await ctx.accept_and_report(work)


agent.run()
