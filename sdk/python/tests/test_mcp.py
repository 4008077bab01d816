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


#: How the client picks its revision: ``auto`` probes ``server/discover`` and, answered,
#: speaks the stateless 2026-07-28; ``legacy`` forces the initialize handshake (2025-11-25).
MODES = ["auto", "legacy"]

#: The revision each mode ends up speaking with the router.
SPOKEN = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def client(stack: Stack, caller: str, mode: str = "auto") -> Client:
    http = create_mcp_http_client(headers={"authorization": f"Bearer {stack.token(caller)}"})
    return Client(streamable_http_client(f"{stack.router.url}/mcp", http_client=http), mode=mode)


async def session(stack: Stack, caller: str, work: Callable[[Client], Any], mode: str = "auto") -> Any:
    async with client(stack, caller, mode) as connected:
        assert connected.protocol_version == SPOKEN[mode], connected.protocol_version
        return await work(connected)


@pytest.mark.parametrize("mode", MODES)
def test_an_mcp_client_lists_and_calls_the_capabilities_its_token_may_call(
    stack: Stack, start_agent: Callable[..., Agent], mode: str
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
        # The envelope is in _meta: the tool declares an outputSchema, which an error's content would not match.
        assert bad.structured_content is None
        assert bad.meta is not None
        assert bad.meta["agent-reach/error"]["code"] == "SCHEMA_MISMATCH"
        assert bad.content[0].type == "text"
        assert "SCHEMA_MISMATCH" in bad.content[0].text
        missing = await mcp.call_tool("test.mcp_price", {"order_id": "SO-404"})
        assert missing.is_error
        # The envelope is in _meta: the tool declares an outputSchema, which an error's content would not match.
        assert missing.structured_content is None
        assert missing.meta is not None
        assert missing.meta["agent-reach/error"]["code"] == "AGENT_ERROR"
        assert "ORDER_NOT_FOUND" in str(missing.meta["agent-reach/error"])

    asyncio.run(session(stack, "tester", as_tester, mode))

    async def as_demo_user(mcp: Client) -> None:
        # `demo_user` may call intent.parse only (acl.yaml): no test.* tool is listed, and calling one is refused.
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        assert not any(name.startswith("test.") for name in names), names
        refused = await mcp.call_tool("test.mcp_price", {"order_id": "SO-1"})
        assert refused.is_error
        # The envelope is in _meta: the tool declares an outputSchema, which an error's content would not match.
        assert refused.structured_content is None
        assert refused.meta is not None
        assert refused.meta["agent-reach/error"]["code"] == "FORBIDDEN"

    asyncio.run(session(stack, "demo_user", as_demo_user, mode))


def rpc(
    stack: Stack,
    body: Any,
    *,
    token: str | None = "tester",
    raw: bytes | None = None,
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json", **(extra or {})}
    if token is not None:
        headers["authorization"] = f"Bearer {stack.token(token)}"
    if raw is not None:
        return httpx.post(f"{stack.router.url}/mcp", content=raw, headers=headers, timeout=10)
    return httpx.post(f"{stack.router.url}/mcp", json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("mode", MODES)
def test_a_streaming_capability_reports_each_event_as_mcp_progress(
    stack: Stack, start_agent: Callable[..., Agent], mode: str
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
        # The envelope is in _meta: the tool declares an outputSchema, which an error's content would not match.
        assert failed.structured_content is None
        assert failed.meta is not None
        assert failed.meta["agent-reach/error"]["code"] == "AGENT_ERROR"
        # Without a progress callback the items arrive collected, as before.
        collected = await mcp.call_tool("test.mcp_tokens", {"text": "one"})
        assert collected.structured_content == {"result": [{"token": "one"}]}

    asyncio.run(session(stack, "tester", as_tester, mode))


@pytest.mark.parametrize(
    ("body", "raw", "status", "code"),
    [
        (None, b"{not json", 400, -32700),
        ([], None, 400, -32600),
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
        # RFC 6750: `invalid_token` only when a token was sent (no issuer here: no metadata pointer).
        invalid = "" if token is None else ', error="invalid_token"'
        assert answer.headers["www-authenticate"] == f'Bearer realm="agent-reach"{invalid}'
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


MODERN = "2026-07-28"


def modern(method: str, params: dict[str, Any] | None = None, *, request_id: Any = 1) -> dict[str, Any]:
    """A 2026-07-28 request: its version and the client's capabilities in ``_meta``."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**(params or {}), "_meta": meta}}


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {"mcp-protocol-version": MODERN, "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return headers


def test_the_stateless_revision_checks_its_headers_and_meta_and_marks_its_results(
    stack: Stack, start_agent: Callable[..., Agent]
) -> None:
    start_agent(pricing_agent(stack))
    discovered = rpc(stack, modern("server/discover"), extra=modern_headers("server/discover"))
    assert discovered.status_code == 200, discovered.text
    result = discovered.json()["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][0] == MODERN
    assert "2025-11-25" in result["supportedVersions"]
    assert (result["cacheScope"], result["ttlMs"] > 0) == ("public", True)
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "agent-reach-router"

    listed = rpc(stack, modern("tools/list"), extra=modern_headers("tools/list")).json()["result"]
    assert listed["cacheScope"] == "private", listed  # the list is this token's (acl.yaml)
    assert listed["ttlMs"] > 0
    assert "test.mcp_price" in [tool["name"] for tool in listed["tools"]]

    call = modern("tools/call", {"name": "test.mcp_price", "arguments": {"order_id": "SO-9"}})
    called = rpc(stack, call, extra=modern_headers("tools/call", "test.mcp_price")).json()["result"]
    assert (called["resultType"], called["structuredContent"]["total_cents"]) == ("complete", 250)
    # A name outside the header-safe set travels Base64-encoded; this one is plain, encoded all the same.
    encoded = "=?base64?dGVzdC5tY3BfcHJpY2U=?="
    assert rpc(stack, call, extra=modern_headers("tools/call", encoded)).status_code == 200

    def refused(body: Any, headers: dict[str, str]) -> tuple[int, int]:
        answer = rpc(stack, body, extra=headers)
        return answer.status_code, answer.json()["error"]["code"]

    assert refused(call, modern_headers("tools/call", "test.other")) == (400, -32020)
    assert refused(call, modern_headers("tools/call")) == (400, -32020)
    assert refused(call, modern_headers("tools/list", "test.mcp_price")) == (400, -32020)
    assert refused(call, {"mcp-protocol-version": MODERN}) == (400, -32020)
    stale = modern("tools/list")
    stale["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2025-11-25"
    assert refused(stale, modern_headers("tools/list")) == (400, -32020)
    no_meta = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    assert refused(no_meta, modern_headers("tools/list")) == (400, -32602)
    no_capabilities = modern("tools/list")
    del no_capabilities["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    assert refused(no_capabilities, modern_headers("tools/list")) == (400, -32602)
    # The handshake and ping are gone in this revision: an unknown method is 404.
    assert refused(modern("initialize"), modern_headers("initialize")) == (404, -32601)
    assert refused(modern("ping"), modern_headers("ping")) == (404, -32601)
    # A batch is not a message of this revision.
    assert refused([modern("tools/list")], modern_headers("tools/list")) == (400, -32600)

    unknown = rpc(stack, modern("tools/list"), extra={"mcp-protocol-version": "1999-01-01"})
    assert unknown.status_code == 400
    error = unknown.json()["error"]
    assert error["code"] == -32022
    assert (error["data"]["requested"], MODERN in error["data"]["supported"]) == ("1999-01-01", True)


def test_batches_are_answered_under_the_revision_that_allows_them(stack: Stack) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "b", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "c", "method": "no/such"},
        {"jsonrpc": "2.0", "id": "d", "method": "initialize", "params": {"protocolVersion": "2025-03-26"}},
    ]
    for extra in ({}, {"mcp-protocol-version": "2025-03-26"}):
        answer = rpc(stack, batch, extra=extra)
        assert answer.status_code == 200, answer.text
        replies = answer.json()
        assert [reply["id"] for reply in replies] == ["a", "b", "c", "d"], replies
        assert replies[0]["result"] == {}
        assert isinstance(replies[1]["result"]["tools"], list)
        assert replies[2]["error"]["code"] == -32601
        assert replies[3]["error"]["code"] == -32600  # initialize may not be batched
    only_notifications = [{"jsonrpc": "2.0", "method": "notifications/initialized"}]
    assert rpc(stack, only_notifications).status_code == 202
    # 2025-06-18 and later took batches away.
    for version in ("2025-06-18", "2025-11-25"):
        later = rpc(stack, batch, extra={"mcp-protocol-version": version})
        assert (later.status_code, later.json()["error"]["code"]) == (400, -32600)
