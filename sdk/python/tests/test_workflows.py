"""Workflows (issue 36, DESIGN §9) from the Python side, against the real binaries: a
workflow registered through the registry is an A2A agent (its card lists it, the official
``a2a-sdk`` client sends it a message) and an MCP tool (the official ``mcp`` client lists
and calls it), each call a run of its steps on Python agents. And preemption with a Python
agent: a preemptible handler asked to pause returns a checkpoint, its task is ``paused``,
and it resumes from the checkpoint once the urgent task ran."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_message
from a2a.types import Role, SendMessageRequest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import BaseModel

from agent_reach import Agent, Ctx, Paused

from .conftest import make_agent
from .support.stack import Stack, wait_until


class Order(BaseModel):
    order_id: str


class Priced(BaseModel):
    order_id: str
    total_cents: int


class Label(BaseModel):
    label: str


QUOTE = {
    "version": "1.0.0",
    "description": "Price an order and label it.",
    "input_schema": {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}},
    "output_schema": {"type": "object", "required": ["label"]},
    "steps": [
        {"id": "price", "capability": "test.wf_price", "input": {"order_id": "${input.order_id}"}},
        {
            "id": "label",
            "capability": "test.wf_label",
            "input": {"order_id": "${input.order_id}", "total_cents": "${steps.price.output.total_cents}"},
        },
    ],
    "output": {"label": "${steps.label.output.label}", "cents": "${steps.price.output.total_cents}"},
}


def quote_agents(stack: Stack) -> Agent:
    agent = make_agent(stack)

    @agent.handler("test.wf_price", version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        return Priced(order_id=payload.order_id, total_cents=100 * len(payload.order_id))

    @agent.handler("test.wf_label", version="1.0.0")
    async def label(payload: Priced) -> Label:
        """Label a priced order."""
        return Label(label=f"{payload.order_id}: {payload.total_cents / 100:.2f} EUR")

    return agent


def register(stack: Stack, name: str, definition: dict[str, Any]) -> None:
    # `tester` provides test.* (acl.yaml's providers), so it may register test.* workflows.
    response = httpx.put(
        f"{stack.registry.url}/v1/workflows/{name}",
        json=definition,
        headers={"authorization": f"Bearer {stack.token('tester')}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text

    def offered() -> bool:
        card = httpx.get(f"{stack.router.url}/a2a/{name}/.well-known/agent-card.json", timeout=5)
        return card.status_code == 200

    wait_until(offered, 10, f"{name} offered by the router")


@contextlib.asynccontextmanager
async def a2a_client(stack: Stack, name: str) -> AsyncIterator[Any]:
    http = httpx.AsyncClient(headers={"authorization": f"Bearer {stack.token('tester')}"}, timeout=20)
    try:
        yield await create_client(
            f"{stack.router.url}/a2a/{name}", client_config=ClientConfig(httpx_client=http, streaming=False)
        )
    finally:
        await http.aclose()


def test_a_workflow_is_an_a2a_agent_and_an_mcp_tool(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    start_agent(quote_agents(stack))
    register(stack, "test.wf_quote", QUOTE)

    card = httpx.get(f"{stack.router.url}/a2a/test.wf_quote/.well-known/agent-card.json").json()
    assert card["name"] == "test.wf_quote"
    assert card["version"] == "1.0.0"
    assert card["description"] == "Price an order and label it."
    assert card["skills"][0]["id"] == "test.wf_quote"

    async def over_a2a() -> None:
        async with a2a_client(stack, "test.wf_quote") as client:
            request = SendMessageRequest(message=new_data_message({"order_id": "SO-12"}, role=Role.ROLE_USER))
            answers = [answer async for answer in client.send_message(request)]
            (data,) = get_data_parts(answers[0].message.parts)
            assert data == {"label": "SO-12: 5.00 EUR", "cents": 500}

    asyncio.run(over_a2a())

    async def over_mcp() -> None:
        http = create_mcp_http_client(headers={"authorization": f"Bearer {stack.token('tester')}"})
        async with Client(streamable_http_client(f"{stack.router.url}/mcp", http_client=http)) as mcp:
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            assert tools["test.wf_quote"].description == "Price an order and label it."
            assert tools["test.wf_quote"].input_schema["required"] == ["order_id"]
            result = await mcp.call_tool("test.wf_quote", {"order_id": "SO-7"})
            assert not result.is_error, result
            assert result.structured_content == {"label": "SO-7: 4.00 EUR", "cents": 400}
            refused = await mcp.call_tool("test.wf_quote", {"order": 1})
            assert refused.is_error
            assert refused.meta is not None
            assert refused.meta["agent-reach/error"]["code"] == "SCHEMA_MISMATCH"

    asyncio.run(over_mcp())


class Job(BaseModel):
    id: str
    steps: int


class Done(BaseModel):
    id: str
    resumed_from: int


def submit(stack: Stack, capability: str, priority: str, job_id: str, steps: int) -> str:
    response = httpx.post(
        f"{stack.router.url}/v1/tasks",
        json={
            "capability": capability,
            "priority": priority,
            "request_id": job_id,
            "payload": {"id": job_id, "steps": steps},
            "timeout_ms": 30_000,
        },
        headers={"authorization": f"Bearer {stack.token('tester')}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    task_id: str = response.json()["task_id"]
    return task_id


def ended(stack: Stack, task_id: str) -> dict[str, Any]:
    view: dict[str, Any] = {}

    def done() -> bool:
        nonlocal view
        view = httpx.get(
            f"{stack.router.url}/v1/tasks/{task_id}",
            headers={"authorization": f"Bearer {stack.token('tester')}"},
            timeout=10,
        ).json()
        return view["status"] in ("succeeded", "failed", "canceled")

    wait_until(done, 30, f"task {task_id} ended")
    return view


def test_a_preemptible_python_handler_pauses_and_resumes_from_its_checkpoint(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    starts: list[tuple[str, int]] = []
    agent = make_agent(stack, max_concurrency=1)

    @agent.handler("test.wf_long", version="1.0.0", preemptible=True)
    async def long_job(payload: Job, ctx: Ctx) -> Done:
        """Long work that pauses when asked."""
        start = int(ctx.checkpoint["done"]) if ctx.checkpoint else 0
        starts.append((payload.id, start))
        for step in range(start, payload.steps):
            if ctx.pause_requested:
                raise Paused({"done": step})
            await asyncio.sleep(0.025)
        return Done(id=payload.id, resumed_from=start)

    start_agent(agent)
    low = submit(stack, "test.wf_long", "low", f"py-low-{time.time_ns()}", 60)
    wait_until(lambda: bool(starts), 10, "the low task started")
    high = submit(stack, "test.wf_long", "high", f"py-high-{time.time_ns()}", 2)
    high_view = ended(stack, high)
    low_view = ended(stack, low)
    assert high_view["status"] == "succeeded", high_view
    assert low_view["status"] == "succeeded", low_view
    states = [transition["status"] for transition in low_view["transitions"]]
    assert "paused" in states, states
    resumed_from = low_view["result"]["output"]["resumed_from"]
    assert resumed_from > 0, low_view
    assert [start for job, start in starts if job.startswith("py-low")] == [0, resumed_from]
    assert high_view["updated_at"] < low_view["updated_at"]
