"""MCP tasks backed by the router's durable tasks (issue 34): a long tool call from a client
that declares the Tasks extension (``io.modelcontextprotocol/tasks``, MCP 2026-07-28)
becomes a task whose id is the slow path's, the same under A2A and ``/v1/tasks/{id}``; the
official ``mcp`` client follows it from ``tools/call`` to its result through a result claim
(``resultType: "task"``) that polls ``tasks/get``. Then a task that asks for input,
answered with ``tasks/update``; ``tasks/cancel``; and the protocol's errors."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import pytest
from mcp.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import BaseModel, Field

from agent_reach import Agent, Ctx, InputRequired

from .conftest import make_agent
from .support.stack import Stack, wait_until

EXTENSION = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    gift: bool | None = None


class Packed(BaseModel):
    order_id: str
    gift: bool


def packing_agent(stack: Stack, release: threading.Event) -> Agent:
    agent = make_agent(stack)

    # A long call (30 s deadline): it becomes a task for a client that takes tasks.
    @agent.handler("test.mcp_pack", version="1.0.0", timeout_ms=30_000)
    async def pack(payload: Order, ctx: Ctx) -> Packed:
        """Pack an order, once released; asks whether it is a gift when not told."""
        if payload.order_id == "SO-ASK" and not ctx.history:
            raise InputRequired("Is it a gift?")
        gift = payload.gift if payload.gift is not None else False
        if payload.order_id != "SO-ASK":
            await asyncio.to_thread(release.wait, 20)
        return Packed(order_id=payload.order_id if payload.order_id != "SO-ASK" else "SO-ASK", gift=gift)

    return agent


@pytest.fixture
def release(stack: Stack, start_agent: Callable[..., Agent]) -> Any:
    event = threading.Event()
    start_agent(packing_agent(stack, event))
    yield event
    event.set()


# === The Tasks extension, for the official client ===


class TaskIdParams(RequestParams):
    task_id: str


class TasksGet(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class TaskCreated(Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class DetailedTask(Result):
    result_type: Literal["complete"] = "complete"
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")


class Tasks(ClientExtension):
    """Takes tasks and follows each to its result, noting what it saw."""

    identifier = EXTENSION

    def __init__(self) -> None:
        self.created: list[str] = []
        self.seen: list[str] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.follow)]

    async def follow(self, created: TaskCreated, context: ClaimContext) -> CallToolResult:
        self.created.append(created.task_id)
        for _ in range(1000):
            task = await context.session.send_request(
                TasksGet(params=TaskIdParams(task_id=created.task_id)), DetailedTask
            )
            self.seen.append(task.status)
            if task.status == "completed" and task.result is not None:
                return CallToolResult.model_validate(task.result)
            await asyncio.sleep(0.02)
        raise AssertionError(f"task {created.task_id} never completed: {self.seen}")


@asynccontextmanager
async def connect(stack: Stack, extensions: list[ClientExtension]) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"authorization": f"Bearer {stack.token('tester')}"})
    async with Client(
        streamable_http_client(f"{stack.router.url}/mcp", http_client=http), extensions=extensions
    ) as client:
        yield client


def test_a_long_tool_call_is_a_durable_task_followed_to_its_result(stack: Stack, release: threading.Event) -> None:
    tasks = Tasks()
    headers = {"authorization": f"Bearer {stack.token('tester')}"}

    async def scenario() -> CallToolResult:
        async with connect(stack, [tasks]) as client:
            calling = asyncio.create_task(client.call_tool("test.mcp_pack", {"order_id": "SO-71", "gift": True}))
            # While it runs, the same task is seen under /v1/tasks and by A2A, by its one id.
            await asyncio.to_thread(wait_until, lambda: bool(tasks.created), 10, "the task's creation")
            task_id = tasks.created[0]
            assert task_id.startswith("t_"), task_id
            http = httpx.AsyncClient(headers=headers)
            view = (await http.get(f"{stack.router.url}/v1/tasks/{task_id}")).json()
            assert view["capability"] == "test.mcp_pack"
            assert view["status"] in ("pending", "running"), view
            rpc = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
            a2a = (
                await http.post(f"{stack.router.url}/a2a/test.mcp_pack", json=rpc, headers={"a2a-version": "1.0"})
            ).json()
            await http.aclose()
            assert a2a["result"]["id"] == task_id, a2a
            release.set()
            return await asyncio.wait_for(calling, 20)

    result = asyncio.run(scenario())
    assert result.is_error is False, result
    assert result.structured_content == {"order_id": "SO-71", "gift": True}
    assert "working" in tasks.seen, tasks.seen
    assert tasks.seen[-1] == "completed", tasks.seen
    view = httpx.get(f"{stack.router.url}/v1/tasks/{tasks.created[0]}", headers=headers).json()
    assert view["status"] == "succeeded"
    assert view["result"]["output"] == {"order_id": "SO-71", "gift": True}


def test_a_client_without_the_extension_gets_a_plain_result(stack: Stack, release: threading.Event) -> None:
    release.set()

    async def scenario() -> CallToolResult:
        async with connect(stack, []) as client:
            return await client.call_tool("test.mcp_pack", {"order_id": "SO-72"})

    result = asyncio.run(scenario())
    assert result.structured_content == {"order_id": "SO-72", "gift": False}


# === The methods, on the wire ===


def post(stack: Stack, method: str, params: dict[str, Any], *, extension: bool = True, name: str | None = None) -> Any:
    capabilities: dict[str, Any] = {"extensions": {EXTENSION: {}}} if extension else {}
    body = {
        "jsonrpc": "2.0",
        "id": str(uuid.uuid4()),
        "method": method,
        "params": {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": capabilities,
            },
        },
    }
    headers = {
        "authorization": f"Bearer {stack.token('tester')}",
        "mcp-protocol-version": VERSION,
        "mcp-method": method,
        "accept": "application/json, text/event-stream",
    }
    named = name if name is not None else params.get("name", params.get("taskId"))
    if named is not None:
        headers["mcp-name"] = named
    return httpx.post(f"{stack.router.url}/mcp", json=body, headers=headers, timeout=15)


def poll(stack: Stack, task_id: str, status: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def reached() -> bool:
        nonlocal seen
        seen = post(stack, "tasks/get", {"taskId": task_id}).json()["result"]
        return bool(seen["status"] == status)

    wait_until(reached, 10, f"task {task_id} {status}")
    return seen


def test_a_task_asking_for_input_is_answered_with_tasks_update(stack: Stack, release: threading.Event) -> None:
    created = post(stack, "tools/call", {"name": "test.mcp_pack", "arguments": {"order_id": "SO-ASK"}}).json()
    task = created["result"]
    assert task["resultType"] == "task", created
    assert (task["status"], task["pollIntervalMs"]) == ("working", 1000)
    assert task["ttlMs"] > 0
    asked = poll(stack, task["taskId"], "input_required")
    assert asked["statusMessage"] == "Is it a gift?"
    [(key, request)] = asked["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == "Is it a gift?"
    # What it asks for is the tool's input.
    assert "gift" in request["params"]["requestedSchema"]["properties"]
    # An answer to another key is ignored; the one asked continues the task.
    ignored = post(stack, "tasks/update", {"taskId": task["taskId"], "inputResponses": {"other": {"action": "accept"}}})
    assert ignored.json()["result"] == {"resultType": "complete", "_meta": ignored.json()["result"]["_meta"]}
    answer = {"action": "accept", "content": {"order_id": "SO-ASK", "gift": True}}
    acked = post(stack, "tasks/update", {"taskId": task["taskId"], "inputResponses": {key: answer}})
    assert acked.status_code == 200, acked.text
    done = poll(stack, task["taskId"], "completed")
    assert done["result"]["structuredContent"] == {"order_id": "SO-ASK", "gift": True}
    # The conversation, as the slow path keeps it.
    view = httpx.get(
        f"{stack.router.url}/v1/tasks/{task['taskId']}", headers={"authorization": f"Bearer {stack.token('tester')}"}
    ).json()
    assert [turn["role"] for turn in view["turns"]] == ["agent", "user"]


def test_a_task_is_cancelled_and_refusals_are_the_protocols_errors(stack: Stack, release: threading.Event) -> None:
    task = post(stack, "tools/call", {"name": "test.mcp_pack", "arguments": {"order_id": "SO-73"}}).json()["result"]
    acked = post(stack, "tasks/cancel", {"taskId": task["taskId"]})
    assert acked.status_code == 200, acked.text
    assert poll(stack, task["taskId"], "cancelled")["statusMessage"]
    # An unknown task is -32602 (the extension's rule), to get, update or cancel.
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        answered = post(stack, method, {"taskId": "t_000000000000000000000000", "inputResponses": {}})
        assert answered.status_code == 200, answered.text
        assert answered.json()["error"]["code"] == -32602, (method, answered.text)
    # Without the extension declared: -32021 MissingRequiredClientCapability.
    missing = post(stack, "tasks/get", {"taskId": task["taskId"]}, extension=False)
    assert missing.json()["error"]["code"] == -32021, missing.text
    # Mcp-Name must name the task.
    mismatch = post(stack, "tasks/get", {"taskId": task["taskId"]}, name="t_other")
    assert (mismatch.status_code, mismatch.json()["error"]["code"]) == (400, -32020), mismatch.text
    # Bad params: no taskId, inputResponses not an object, an action that is none.
    assert post(stack, "tasks/get", {}, name="").json()["error"]["code"] == -32602
    bad = post(stack, "tasks/update", {"taskId": task["taskId"], "inputResponses": "yes"})
    assert bad.json()["error"]["code"] == -32602, bad.text
    # The extension is advertised by server/discover.
    discovered = post(stack, "server/discover", {}).json()["result"]
    assert EXTENSION in discovered["capabilities"]["extensions"]
