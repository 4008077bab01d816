"""A2A's HTTP+JSON/REST binding (spec §11) at ``/a2a/{capability}/v1/…`` (DESIGN §8, §9,
docs/protocols.md): the official ``a2a-sdk`` client picks it from the card and sends,
streams and manages tasks over it; the same scenario over JSON-RPC and REST gives the same
answers; bad input is a ``google.rpc.Status`` with the spec's HTTP status, never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_message
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
)
from pydantic import BaseModel, Field

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Stack

PRICE = "test.a2a_rest_price"
TOKENS = "test.a2a_rest_tokens"


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    count: int = Field(default=1, ge=1)


class Priced(BaseModel):
    order_id: str
    total_cents: int


class Text(BaseModel):
    text: str


class Token(BaseModel):
    token: str


@pytest.fixture
def agent(stack: Stack, start_agent: Callable[..., Agent]) -> Agent:
    agent = make_agent(stack)

    @agent.handler(PRICE, version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        return Priced(order_id=payload.order_id, total_cents=250 * payload.count)

    @agent.handler(TOKENS, version="1.0.0")
    async def tokens(payload: Text) -> AsyncIterator[Token]:
        """Stream the words of a text."""
        for word in payload.text.split(" "):
            yield Token(token=word)

    return start_agent(agent)


def auth(stack: Stack, caller: str = "tester") -> dict[str, str]:
    return {"authorization": f"Bearer {stack.token(caller)}"}


@contextlib.asynccontextmanager
async def connect(stack: Stack, capability: str, binding: str, **config: Any) -> AsyncIterator[Any]:
    """An a2a-sdk client for ``capability`` that speaks ``binding`` only, chosen from the card."""
    http = httpx.AsyncClient(headers=auth(stack), timeout=10)
    try:
        client_config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding], **config)
        yield await create_client(f"{stack.router.url}/a2a/{capability}", client_config=client_config)
    finally:
        await http.aclose()


def url(stack: Stack, capability: str, path: str) -> str:
    return f"{stack.router.url}/a2a/{capability}/v1/{path}"


def test_the_card_lists_every_binding(stack: Stack, agent: Agent) -> None:
    del agent
    card = httpx.get(f"{stack.router.url}/a2a/{PRICE}/.well-known/agent-card.json").json()
    interfaces = {interface["protocolBinding"]: interface["url"] for interface in card["supportedInterfaces"]}
    assert interfaces == {
        "JSONRPC": f"{stack.router.url}/a2a/{PRICE}",
        "HTTP+JSON": f"{stack.router.url}/a2a/{PRICE}/v1",
        # gRPC takes an address; the agent is each request's `tenant` (test_a2a_bindings.py).
        "GRPC": stack.router.url.removeprefix("http://"),
    }


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_the_same_scenario_gives_the_same_answers_over_both_bindings(stack: Stack, agent: Agent, binding: str) -> None:
    del agent

    async def scenario() -> None:
        async with connect(stack, PRICE, binding, streaming=False) as client:
            request = SendMessageRequest(
                message=new_data_message({"order_id": "SO-1", "count": 2}, role=Role.ROLE_USER)
            )
            (answer,) = [answer async for answer in client.send_message(request)]
            assert get_data_parts(answer.message.parts) == [{"order_id": "SO-1", "total_cents": 500}]
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="t_no_such_task"))
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(CancelTaskRequest(id="t_no_such_task"))

        # A durable task (returned at once), then read, listed and (ended) not cancelable.
        async with connect(stack, PRICE, binding, streaming=False, polling=True) as client:
            request = SendMessageRequest(message=new_data_message({"order_id": "SO-2"}, role=Role.ROLE_USER))
            (answer,) = [answer async for answer in client.send_message(request)]
            task_id = answer.task.id
            assert task_id.startswith("t_")
            for _ in range(500):
                task = await client.get_task(GetTaskRequest(id=task_id, history_length=1))
                if task.status.state == TaskState.TASK_STATE_COMPLETED:
                    break
                await asyncio.sleep(0.02)
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_data_parts(task.artifacts[0].parts) == [{"order_id": "SO-2", "total_cents": 250}]
            assert len(task.history) == 1
            listed = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED))
            assert task_id in [listed_task.id for listed_task in listed.tasks]
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task_id))

        async with connect(stack, TOKENS, binding, streaming=True) as client:
            message = new_data_message({"text": "ship it today"}, role=Role.ROLE_USER)
            events = [event async for event in client.send_message(SendMessageRequest(message=message))]
        kinds = [event.WhichOneof("payload") for event in events]
        assert kinds == ["task", "artifact_update", "artifact_update", "artifact_update", "status_update"], kinds
        chunks = [event.artifact_update for event in events[1:4]]
        assert [get_data_parts(chunk.artifact.parts) for chunk in chunks] == [
            [{"token": "ship"}],
            [{"token": "it"}],
            [{"token": "today"}],
        ]
        assert [chunk.last_chunk for chunk in chunks] == [False, False, True]
        assert events[4].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    asyncio.run(scenario())


def test_rest_errors_are_google_rpc_statuses(stack: Stack, agent: Agent) -> None:
    del agent
    headers = auth(stack)

    def status(response: httpx.Response) -> tuple[int, str, str | None]:
        error = response.json()["error"]
        assert error["code"] == response.status_code, error
        reason = next(
            (detail["reason"] for detail in error["details"] if detail["@type"].endswith("google.rpc.ErrorInfo")),
            None,
        )
        return response.status_code, error["status"], reason

    assert status(httpx.get(url(stack, PRICE, "tasks/t_nope"), headers=headers)) == (
        404,
        "NOT_FOUND",
        "TASK_NOT_FOUND",
    )
    assert status(httpx.get(url(stack, PRICE, "nothing/here"), headers=headers))[:2] == (404, "NOT_FOUND")
    assert status(httpx.delete(url(stack, PRICE, "tasks/t_nope"), headers=headers))[:2] == (404, "NOT_FOUND")
    assert status(httpx.put(url(stack, PRICE, "tasks"), json={}, headers=headers))[:2] == (404, "NOT_FOUND")
    assert status(httpx.get(url(stack, PRICE, "tasks?pagesize=5"), headers=headers))[:2] == (400, "INVALID_ARGUMENT")
    assert status(httpx.get(url(stack, PRICE, "tasks?pageSize=0"), headers=headers))[:2] == (400, "INVALID_ARGUMENT")
    assert status(httpx.get(url(stack, PRICE, "tasks/t_x?historyLength=-1"), headers=headers))[:2] == (
        400,
        "INVALID_ARGUMENT",
    )
    broken = httpx.post(url(stack, PRICE, "message:send"), content=b"{nope", headers=headers)
    assert status(broken)[:2] == (400, "INVALID_ARGUMENT")
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"data": {"order_id": "S"}}]}
    mismatch = httpx.post(url(stack, PRICE, "message:send"), json={"message": message}, headers=headers)
    assert status(mismatch) == (400, "INVALID_ARGUMENT", "SCHEMA_MISMATCH")
    file_part = {**message, "parts": [{"url": "https://example.com/order.pdf"}]}
    unsupported = httpx.post(url(stack, PRICE, "message:send"), json={"message": file_part}, headers=headers)
    assert status(unsupported) == (400, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED")
    card = httpx.get(url(stack, PRICE, "extendedAgentCard"), headers=headers)
    assert status(card) == (400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION")
    version = httpx.get(url(stack, PRICE, "tasks"), headers={**headers, "a2a-version": "0.3"})
    assert status(version) == (400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED")
    other = httpx.post(url(stack, PRICE, "tasks/t_a:cancel"), json={"id": "t_b"}, headers=headers)
    assert status(other)[:2] == (400, "INVALID_ARGUMENT")

    unauthenticated = httpx.get(url(stack, PRICE, "tasks"))
    assert status(unauthenticated) == (401, "UNAUTHENTICATED", "UNAUTHENTICATED")
    assert unauthenticated.headers["www-authenticate"] == 'Bearer realm="agent-reach"'
    forbidden = httpx.post(
        url(stack, PRICE, "message:send"), json={"message": message}, headers=auth(stack, "demo_user")
    )
    assert status(forbidden) == (403, "PERMISSION_DENIED", "FORBIDDEN")
    unknown = httpx.post(url(stack, "no.such.capability", "message:send"), json={"message": message}, headers=headers)
    assert status(unknown) == (404, "NOT_FOUND", "CAPABILITY_NOT_FOUND")

    # A result is the bare object, in the binding's media type.
    fine = {**message, "parts": [{"data": {"order_id": "SO-3"}}]}
    sent = httpx.post(url(stack, PRICE, "message:send"), json={"message": fine}, headers=headers)
    assert sent.status_code == 200, sent.text
    assert sent.headers["content-type"] == "application/a2a+json"
    assert sent.json()["message"]["parts"] == [{"data": {"order_id": "SO-3", "total_cents": 250}}]
    listed = httpx.get(url(stack, PRICE, "tasks?pageSize=2&includeArtifacts=true"), headers=headers).json()
    assert set(listed) == {"tasks", "nextPageToken", "pageSize", "totalSize"}, listed
    assert listed["pageSize"] == 2
