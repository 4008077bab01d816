"""The router's A2A front door (``/a2a/{capability}``, DESIGN §8) driven by the official
``a2a-sdk`` client from PyPI: card resolution, send (DataPart and TextPart), stream,
get, list and cancel, through the router's one admission to a real agent. Then v0.3's
method names and bad input on the route, each A2A's error and never a 500."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_message, new_text_message
from a2a.types import (
    CancelTaskRequest,
    ContentTypeNotSupportedError,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    TaskNotFoundError,
    TaskState,
)
from pydantic import BaseModel, Field

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Stack


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    count: int = Field(default=1, ge=1)


class Priced(BaseModel):
    order_id: str
    total_cents: int


class Said(BaseModel):
    text: str


def a2a_agent(stack: Stack) -> Agent:
    agent = make_agent(stack)

    @agent.handler("test.a2a_price", version="1.2.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        return Priced(order_id=payload.order_id, total_cents=250 * payload.count)

    @agent.handler("text.a2a_shout", version="1.0.0")
    async def shout(payload: Said) -> Said:
        """Shout the text back."""
        return Said(text=payload.text.upper())

    return agent


def auth(stack: Stack, caller: str = "tester") -> dict[str, str]:
    return {"authorization": f"Bearer {stack.token(caller)}"}


@contextlib.asynccontextmanager
async def connect(stack: Stack, capability: str, *, streaming: bool) -> AsyncIterator[Any]:
    """An a2a-sdk client for ``capability``'s agent, resolved from its card, as ``tester``."""
    http = httpx.AsyncClient(headers=auth(stack), timeout=10)
    try:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield await create_client(f"{stack.router.url}/a2a/{capability}", client_config=config)
    finally:
        await http.aclose()


def test_an_a2a_client_resolves_the_card_sends_streams_and_asks_for_tasks(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    start_agent(a2a_agent(stack))

    card = httpx.get(f"{stack.router.url}/a2a/test.a2a_price/.well-known/agent-card.json").json()
    assert card["name"] == "test.a2a_price"
    assert card["version"] == "1.2.0"
    assert card["supportedInterfaces"][0]["url"] == f"{stack.router.url}/a2a/test.a2a_price"
    assert card["capabilities"]["streaming"] is True
    # Push configs are the slow path's callbacks: on with --redis (the stack's router has it).
    assert card["capabilities"]["pushNotifications"] is True
    schemas = card["capabilities"]["extensions"][0]["params"]
    assert schemas["input_schema"]["required"] == ["order_id"]
    assert card["skills"][0]["id"] == "test.a2a_price"
    assert "httpAuthSecurityScheme" in card["securitySchemes"]["bearer"]

    async def send_and_ask() -> None:
        async with connect(stack, "test.a2a_price", streaming=False) as client:
            request = SendMessageRequest(
                message=new_data_message({"order_id": "SO-1", "count": 2}, role=Role.ROLE_USER)
            )
            answers = [answer async for answer in client.send_message(request)]
            assert len(answers) == 1
            assert answers[0].HasField("message")
            (data,) = get_data_parts(answers[0].message.parts)
            assert data == {"order_id": "SO-1", "total_cents": 500}
            assert answers[0].message.role == Role.ROLE_AGENT

            with pytest.raises(ContentTypeNotSupportedError):
                async for _ in client.send_message(
                    SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
                ):
                    pass
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="no-such-task"))
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(CancelTaskRequest(id="no-such-task"))
            listed = await client.list_tasks(ListTasksRequest())
            assert all(task.id.startswith("t_") for task in listed.tasks)

        # A TextPart maps to {"text": ...} for a capability whose input takes a string `text`.
        async with connect(stack, "text.a2a_shout", streaming=False) as client:
            request = SendMessageRequest(message=new_text_message("ship it", role=Role.ROLE_USER))
            answers = [answer async for answer in client.send_message(request)]
            assert get_data_parts(answers[0].message.parts) == [{"text": "SHIP IT"}]

    asyncio.run(send_and_ask())

    async def stream() -> None:
        async with connect(stack, "test.a2a_price", streaming=True) as client:
            request = SendMessageRequest(message=new_data_message({"order_id": "SO-2"}, role=Role.ROLE_USER))
            events = [event async for event in client.send_message(request)]
        kinds = [event.WhichOneof("payload") for event in events]
        assert kinds == ["task", "artifact_update", "status_update"], events
        assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
        assert get_data_parts(events[1].artifact_update.artifact.parts) == [{"order_id": "SO-2", "total_cents": 250}]
        assert events[2].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        assert events[2].status_update.task_id == events[0].task.id

    asyncio.run(stream())


def rpc(stack: Stack, capability: str, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
    merged = {**auth(stack), **(headers or {})}
    return httpx.post(f"{stack.router.url}/a2a/{capability}", json=body, headers=merged, timeout=10)


def send_params(part: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [part]}}


def test_v0_3_method_names_are_served_when_no_newer_version_is_asked(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    start_agent(a2a_agent(stack))
    legacy = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m-7",
                "role": "user",
                "parts": [{"kind": "data", "data": {"order_id": "SO-7"}}],
            }
        },
    }
    answer = rpc(stack, "test.a2a_price", legacy).json()
    assert answer["result"]["kind"] == "message", answer
    assert answer["result"]["parts"] == [{"kind": "data", "data": {"order_id": "SO-7", "total_cents": 250}}]
    # With A2A-Version 1.0 the v0.3 names are unknown methods.
    refused = rpc(stack, "test.a2a_price", legacy, headers={"a2a-version": "1.0"}).json()
    assert refused["error"]["code"] == -32601
    unsupported = rpc(stack, "test.a2a_price", legacy, headers={"a2a-version": "9.9"}).json()
    assert unsupported["error"]["code"] == -32009


@pytest.mark.parametrize(
    ("capability", "body", "status", "code", "reason"),
    [
        ("test.a2a_price", {"jsonrpc": "2.0", "id": None, "method": "SendMessage", "params": {}}, 200, -32600, None),
        ("test.a2a_price", {"jsonrpc": "1.0", "method": "SendMessage"}, 200, -32600, None),
        ("test.a2a_price", "a string", 200, -32600, None),
        ("test.a2a_price", [], 200, -32600, None),
        ("test.a2a_price", {"jsonrpc": "2.0", "id": 1, "method": "Teleport", "params": {}}, 200, -32601, None),
        ("test.a2a_price", {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": []}, 200, -32602, None),
        ("test.a2a_price", {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}, 200, -32602, None),
        ("test.a2a_price", {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}, 200, -32602, None),
        (
            "test.a2a_price",
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params({"data": {"count": 0}})},
            200,
            -32602,
            "SCHEMA_MISMATCH",
        ),
        (
            "test.a2a_price",
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params({"url": "http://x"})},
            200,
            -32005,
            None,
        ),
        (
            "no.such.capability",
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params({"data": {}})},
            404,
            -32600,
            "CAPABILITY_NOT_FOUND",
        ),
        (
            "test.a2a_price",
            {"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig", "params": {}},
            200,
            -32602,
            None,
        ),
    ],
)
def test_bad_input_on_a2a_is_an_a2a_error(
    stack: Stack,
    start_agent: Callable[..., Agent],
    capability: str,
    body: Any,
    status: int,
    code: int,
    reason: str | None,
) -> None:
    start_agent(a2a_agent(stack))
    answer = rpc(stack, capability, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code, answer.text
    if reason is not None:
        assert error["data"][0]["reason"] == reason, answer.text


def test_a2a_refuses_bad_tokens_and_unknown_cards_and_serves_the_root_card(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    start_agent(a2a_agent(stack))
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send_params({"data": {"order_id": "SO-1"}})}
    for headers in ({}, {"authorization": "Bearer not-a-token"}):
        answer = httpx.post(f"{stack.router.url}/a2a/test.a2a_price", json=body, headers=headers)
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    # `demo_user` may not call test.* (acl.yaml).
    forbidden = httpx.post(f"{stack.router.url}/a2a/test.a2a_price", json=body, headers=auth(stack, "demo_user"))
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["data"][0]["reason"] == "FORBIDDEN"
    assert (
        httpx.post(f"{stack.router.url}/a2a/test.a2a_price", content=b"{nope", headers=auth(stack)).json()["error"][
            "code"
        ]
        == -32700
    )
    assert httpx.get(f"{stack.router.url}/a2a/no.such/.well-known/agent-card.json").status_code == 404
    assert httpx.get(f"{stack.router.url}/.well-known/agent-card.json").status_code == 404

    key = str(stack.directory / "assertion.pem")
    rooted = stack.start_router(["--assertion-key", key, "--a2a-root-capability", "test.a2a_price"])
    try:
        card = httpx.get(f"{rooted.url}/.well-known/agent-card.json").json()
        assert card["name"] == "test.a2a_price"
        assert card["supportedInterfaces"][0]["url"] == f"{rooted.url}/a2a/test.a2a_price"
        # Without --redis there are no durable tasks: the card says so and the task methods answer A2A's errors.
        assert card["capabilities"]["pushNotifications"] is False
        url = f"{rooted.url}/a2a/test.a2a_price"
        message = send_params({"data": {"order_id": "SO-1"}})["message"]
        for method, params, code in [
            ("CreateTaskPushNotificationConfig", {"taskId": "t_0", "url": "http://127.0.0.1:9/hook"}, -32003),
            ("GetTask", {"id": "t_0"}, -32001),
            ("SendMessage", {"message": message, "configuration": {"returnImmediately": True}}, -32004),
        ]:
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            answer = httpx.post(url, json=body, headers=auth(stack)).json()
            assert answer["error"]["code"] == code, answer
        listed = httpx.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}, headers=auth(stack)
        ).json()
        assert listed["result"]["tasks"] == [], listed
    finally:
        rooted.stop()
