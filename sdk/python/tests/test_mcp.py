"""The router's MCP front door (``/mcp``, DESIGN §8) driven by the official ``mcp``
client from PyPI, as a desktop assistant would connect: the tools are the capabilities
the caller's token may call (filtered by ``acl.yaml``), a call goes through the router's
one admission to a real agent, failures are tool errors with the stable code. Then bad
input on the route, each a protocol error and never a 500."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import BaseModel, Field

from agent_reach import Agent, HandlerError

from .conftest import make_agent
from .support.stack import Stack


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    count: int = Field(default=1, ge=1)


class Priced(BaseModel):
    order_id: str
    total_cents: int


def pricing_agent(stack: Stack) -> Agent:
    agent = make_agent(stack)

    @agent.handler("test.mcp_price", version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        if payload.order_id == "SO-404":
            raise HandlerError("ORDER_NOT_FOUND", "no order SO-404", status=404)
        return Priced(order_id=payload.order_id, total_cents=250 * payload.count)

    @agent.handler("test.mcp_upper", version="1.0.0")
    async def upper(payload: str) -> str:
        """Upper-case a string (a capability whose input is not an object)."""
        return payload.upper()

    return agent


class Prompt(BaseModel):
    text: str


class Token(BaseModel):
    token: str


def client(stack: Stack, caller: str) -> Client:
    http = create_mcp_http_client(headers={"authorization": f"Bearer {stack.token(caller)}"})
    return Client(streamable_http_client(f"{stack.router.url}/mcp", http_client=http))


async def session(stack: Stack, caller: str, work: Callable[[Client], Any]) -> Any:
    async with client(stack, caller) as connected:
        return await work(connected)


def test_an_mcp_client_lists_and_calls_the_capabilities_its_token_may_call(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    start_agent(pricing_agent(stack))

    async def as_tester(mcp: Client) -> None:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        price = tools["test.mcp_price"]
        assert price.description == "Price an order."
        assert price.input_schema["required"] == ["order_id"]
        assert price.output_schema is not None
        assert price.output_schema["required"] == ["order_id", "total_cents"]
        # Not an object's input: offered wrapped, as MCP tools take an object of arguments.
        upper = tools["test.mcp_upper"]
        assert upper.input_schema["properties"]["input"]["type"] == "string"

        result = await mcp.call_tool("test.mcp_price", {"order_id": "SO-1", "count": 3})
        assert not result.is_error, result
        assert result.structured_content == {"order_id": "SO-1", "total_cents": 750}
        assert result.meta is not None
        assert result.meta["agent-reach/agent_id"].startswith("py_agent")

        wrapped = await mcp.call_tool("test.mcp_upper", {"input": "ship it"})
        assert not wrapped.is_error, wrapped
        assert wrapped.structured_content == {"result": "SHIP IT"}

        # Failures are tool errors carrying the router's stable code.
        bad = await mcp.call_tool("test.mcp_price", {"order_id": "SO-1", "count": 0})
        assert bad.is_error
        assert bad.structured_content is not None
        assert bad.structured_content["error"]["code"] == "SCHEMA_MISMATCH"
        assert bad.content[0].type == "text"
        assert "SCHEMA_MISMATCH" in bad.content[0].text
        missing = await mcp.call_tool("test.mcp_price", {"order_id": "SO-404"})
        assert missing.is_error
        assert missing.structured_content is not None
        assert missing.structured_content["error"]["code"] == "AGENT_ERROR"
        assert "ORDER_NOT_FOUND" in str(missing.structured_content["error"])

    asyncio.run(session(stack, "tester", as_tester))

    async def as_demo_user(mcp: Client) -> None:
        # `demo_user` may call intent.parse only (acl.yaml): no test.* tool is listed, and calling one is refused.
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        assert not any(name.startswith("test.") for name in names), names
        refused = await mcp.call_tool("test.mcp_price", {"order_id": "SO-1"})
        assert refused.is_error
        assert refused.structured_content is not None
        assert refused.structured_content["error"]["code"] == "FORBIDDEN"

    asyncio.run(session(stack, "demo_user", as_demo_user))


def rpc(stack: Stack, body: Any, *, token: str | None = "tester", raw: bytes | None = None) -> httpx.Response:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {stack.token(token)}"
    if raw is not None:
        return httpx.post(f"{stack.router.url}/mcp", content=raw, headers=headers, timeout=10)
    return httpx.post(f"{stack.router.url}/mcp", json=body, headers=headers, timeout=10)


def test_a_streaming_capability_reports_each_event_as_mcp_progress(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    first_seen = threading.Event()
    agent = make_agent(stack)

    @agent.handler("test.mcp_tokens", version="1.0.0")
    async def tokens(payload: Prompt) -> AsyncIterator[Token]:
        """Streams the words of a prompt."""
        if payload.text == "fail":
            yield Token(token="partial")
            raise HandlerError("MODEL_FAILED", "the model gave up")
        words = payload.text.split(" ")
        yield Token(token=words[0])
        # The next word waits until the client has seen the first as progress: events are
        # relayed one by one, before the agent has finished.
        await asyncio.to_thread(first_seen.wait, 10)
        for word in words[1:]:
            yield Token(token=word)

    start_agent(agent)
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))
        first_seen.set()

    async def as_tester(mcp: Client) -> None:
        result = await mcp.call_tool("test.mcp_tokens", {"text": "ship it now"}, progress_callback=on_progress)
        assert not result.is_error, result
        assert result.structured_content == {"result": [{"token": "ship"}, {"token": "it"}, {"token": "now"}]}
        assert [progress for progress, _ in seen] == [1, 2, 3]
        assert seen[0][1] == '{"token":"ship"}'
        # A failure after the first event is a tool error with the stable code.
        failed = await mcp.call_tool("test.mcp_tokens", {"text": "fail"}, progress_callback=on_progress)
        assert failed.is_error
        assert failed.structured_content is not None
        assert failed.structured_content["error"]["code"] == "AGENT_ERROR"
        # Without a progress callback the items arrive collected, as before.
        collected = await mcp.call_tool("test.mcp_tokens", {"text": "one"})
        assert collected.structured_content == {"result": [{"token": "one"}]}

    asyncio.run(session(stack, "tester", as_tester))


@pytest.mark.parametrize(
    ("body", "raw", "status", "code"),
    [
        (None, b"{not json", 400, -32700),
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], None, 400, -32600),
        ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, None, 400, -32600),
        ({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}, None, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1}, None, 400, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}, None, 200, -32601),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": []}, None, 200, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}, None, 200, -32602),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "test.mcp_price", "arguments": 3}},
            None,
            200,
            -32602,
        ),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "no.such.tool"}}, None, 200, -32602),
    ],
)
def test_bad_input_on_mcp_is_a_json_rpc_error(
    stack: Stack, body: Any, raw: bytes | None, status: int, code: int
) -> None:
    answer = rpc(stack, body, raw=raw)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code, answer.text
    assert answer.json()["jsonrpc"] == "2.0"


def test_mcp_refuses_missing_tokens_and_other_methods(stack: Stack) -> None:
    for token in (None, "not-a-token"):
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        answer = httpx.post(
            f"{stack.router.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers
        )
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == "Bearer"
        assert answer.json()["error"]["data"]["code"] == "UNAUTHENTICATED"
    assert httpx.get(f"{stack.router.url}/mcp").status_code == 405
    assert httpx.delete(f"{stack.router.url}/mcp").status_code == 405
    version = httpx.post(
        f"{stack.router.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"authorization": f"Bearer {stack.token('tester')}", "mcp-protocol-version": "1999-01-01"},
    )
    assert version.status_code == 400
    assert "2025-11-25" in version.json()["error"]["data"]["supported"]
    # A notification is accepted with no body; ping answers an empty result.
    assert rpc(stack, {"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    assert rpc(stack, {"jsonrpc": "2.0", "id": "p", "method": "ping"}).json() == {
        "jsonrpc": "2.0",
        "id": "p",
        "result": {},
    }
