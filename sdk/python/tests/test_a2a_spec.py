"""The A2A MUSTs of issue 34 on the JSON-RPC binding (``/a2a/{capability}``, DESIGN §8,
docs/protocols.md), against the real router and agents: the spec's ``ErrorInfo``, the
sender's required fields, several parts to one payload, a message naming a task, JSON-RPC
notifications and batches, the card's caching headers and signature (checked by the SDK's
verifier), and streams whose task id is the server's and whose last chunk says so. The
official ``a2a-sdk`` client drives what it can express; raw JSON-RPC covers the rest."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jwt
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.card_resolver import parse_agent_card
from a2a.helpers.proto_helpers import get_data_parts, new_data_message
from a2a.types import AgentCard, Role, SendMessageRequest, TaskNotFoundError
from a2a.utils.signing import InvalidSignaturesError, NoSignatureError, create_signature_verifier
from pydantic import BaseModel, Field

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Stack

PRICE = "test.a2a_spec_price"
NOTE = "text.a2a_spec_note"
TOKENS = "test.a2a_spec_tokens"


class Order(BaseModel):
    order_id: str = Field(min_length=3)
    count: int = Field(default=1, ge=1)


class Priced(BaseModel):
    order_id: str
    total_cents: int


class Note(BaseModel):
    text: str
    lang: str = "en"


class Token(BaseModel):
    token: str


def spec_agent(stack: Stack) -> Agent:
    agent = make_agent(stack)

    @agent.handler(PRICE, version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        return Priced(order_id=payload.order_id, total_cents=250 * payload.count)

    @agent.handler(NOTE, version="1.0.0")
    async def note(payload: Note) -> Note:
        """Echo a note."""
        return payload

    @agent.handler(TOKENS, version="1.0.0")
    async def tokens(payload: Note) -> AsyncIterator[Token]:
        """Stream the words of a text."""
        for word in payload.text.split(" "):
            yield Token(token=word)

    return agent


@pytest.fixture
def agent(stack: Stack, start_agent: Callable[..., Agent]) -> Agent:
    return start_agent(spec_agent(stack))


def auth(stack: Stack) -> dict[str, str]:
    return {"authorization": f"Bearer {stack.token('tester')}"}


def rpc(stack: Stack, capability: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{stack.router.url}/a2a/{capability}", json=body, headers={**auth(stack), **(headers or {})}, timeout=10
    )


def send(parts: list[dict[str, Any]], *, request_id: Any = 1, **message: Any) -> dict[str, Any]:
    fields = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": parts, **message}
    return {"jsonrpc": "2.0", "id": request_id, "method": "SendMessage", "params": {"message": fields}}


def error_info(answer: dict[str, Any]) -> dict[str, Any]:
    (info,) = answer["error"]["data"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo", answer
    return info


@contextlib.asynccontextmanager
async def connect(stack: Stack, capability: str, *, streaming: bool) -> AsyncIterator[Any]:
    http = httpx.AsyncClient(headers=auth(stack), timeout=10)
    try:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield await create_client(f"{stack.router.url}/a2a/{capability}", client_config=config)
    finally:
        await http.aclose()


def test_a2a_errors_carry_the_specs_error_info(stack: Stack, agent: Agent) -> None:
    del agent
    missing = rpc(stack, PRICE, {"jsonrpc": "2.0", "id": "g", "method": "GetTask", "params": {"id": "t_nope"}}).json()
    assert missing["id"] == "g"
    assert missing["error"]["code"] == -32001
    info = error_info(missing)
    assert (info["domain"], info["reason"]) == ("a2a-protocol.org", "TASK_NOT_FOUND")
    assert all(isinstance(value, str) for value in info["metadata"].values()), info

    # -32005 carries its ErrorInfo too.
    unsupported = rpc(stack, PRICE, send([{"url": "https://example.com/order.pdf"}])).json()
    assert unsupported["error"]["code"] == -32005
    assert error_info(unsupported)["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"

    # -32009 answers the request's id when it could be read, with its ErrorInfo.
    version = rpc(stack, PRICE, send([{"data": {"order_id": "SO-1"}}], request_id=41), {"a2a-version": "9.9"}).json()
    assert version["id"] == 41
    assert version["error"]["code"] == -32009
    assert error_info(version)["reason"] == "VERSION_NOT_SUPPORTED"
    unreadable = httpx.post(
        f"{stack.router.url}/a2a/{PRICE}", content=b"{nope", headers={**auth(stack), "a2a-version": "2.0"}
    ).json()
    assert (unreadable["id"], unreadable["error"]["code"]) == (None, -32009)

    # GetExtendedAgentCard, which the card does not declare (spec §3.3.4).
    card = rpc(stack, PRICE, {"jsonrpc": "2.0", "id": 2, "method": "GetExtendedAgentCard", "params": {}}).json()
    assert card["error"]["code"] == -32004
    assert error_info(card)["reason"] == "UNSUPPORTED_OPERATION"

    # An Agent-Reach refusal on a JSON-RPC code names its stable code in its own domain.
    mismatch = rpc(stack, PRICE, send([{"data": {"order_id": "S"}}])).json()
    assert mismatch["error"]["code"] == -32602
    info = error_info(mismatch)
    assert (info["domain"], info["reason"]) == ("agent-reach", "SCHEMA_MISMATCH")


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "ROLE_USER"}, "messageId"),
        ({"messageId": "", "role": "ROLE_USER"}, "messageId"),
        ({"messageId": "m-1"}, "role"),
        ({"messageId": "m-1", "role": "ROLE_AGENT"}, "role"),
        ({"messageId": "m-1", "role": "ROLE_UNSPECIFIED"}, "role"),
        ({"messageId": "m-1", "role": "ROLE_USER", "taskId": 7}, "taskId"),
    ],
)
def test_a_message_without_its_required_fields_is_invalid_params(
    stack: Stack, agent: Agent, message: dict[str, Any], field: str
) -> None:
    del agent
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {**message, "parts": [{"data": {"order_id": "SO-1"}}]}},
    }
    answer = rpc(stack, PRICE, body)
    assert answer.status_code == 200, answer.text
    error = answer.json()["error"]
    assert error["code"] == -32602, error
    assert field in error["message"], error


def test_several_parts_become_one_payload(stack: Stack, agent: Agent) -> None:
    del agent
    merged = rpc(stack, PRICE, send([{"data": {"order_id": "SO-3"}}, {"data": {"count": 3}}])).json()
    assert merged["result"]["message"]["parts"] == [{"data": {"order_id": "SO-3", "total_cents": 750}}], merged
    joined = rpc(stack, NOTE, send([{"text": "ship"}, {"text": "today"}, {"data": {"lang": "fr"}}])).json()
    assert joined["result"]["message"]["parts"] == [{"data": {"text": "ship\ntoday", "lang": "fr"}}], joined
    # The merged payload is checked against the schema like any other.
    wrong = rpc(stack, PRICE, send([{"data": {"order_id": "SO-3"}}, {"data": {"count": 0}}])).json()
    assert error_info(wrong)["reason"] == "SCHEMA_MISMATCH"
    twice = rpc(stack, PRICE, send([{"data": {"order_id": "SO-3"}}, {"data": {"order_id": "SO-4"}}])).json()
    assert twice["error"]["code"] == -32602
    assert "order_id" in twice["error"]["message"]
    text_to_json = rpc(stack, PRICE, send([{"data": {"order_id": "SO-3"}}, {"text": "hi"}])).json()
    assert text_to_json["error"]["code"] == -32005


def test_a_message_naming_an_unknown_task_is_task_not_found(stack: Stack, agent: Agent) -> None:
    del agent

    async def go() -> None:
        async with connect(stack, PRICE, streaming=False) as client:
            message = new_data_message({"order_id": "SO-5"}, role=Role.ROLE_USER)
            message.task_id = "t_no_such_task"
            with pytest.raises(TaskNotFoundError):
                async for _ in client.send_message(SendMessageRequest(message=message)):
                    pass

    asyncio.run(go())
    answer = rpc(stack, PRICE, send([{"data": {"order_id": "SO-5"}}], taskId="t_no_such_task")).json()
    assert answer["error"]["code"] == -32001
    assert error_info(answer)["reason"] == "TASK_NOT_FOUND"


def test_notifications_get_no_reply_and_batches_one_reply_per_request(stack: Stack, agent: Agent) -> None:
    del agent
    notification = send([{"data": {"order_id": "SO-6"}}])
    del notification["id"]
    answer = rpc(stack, PRICE, notification)
    assert (answer.status_code, answer.content) == (204, b"")

    batch = [
        send([{"data": {"order_id": "SO-7"}}], request_id="first"),
        {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "t_nope"}},
        notification,
        1,
        {"jsonrpc": "2.0", "id": 3, "method": "Teleport", "params": {}},
        {**send([{"data": {"order_id": "SO-8"}}], request_id=4), "method": "SendStreamingMessage"},
    ]
    answer = rpc(stack, PRICE, batch)
    assert answer.status_code == 200, answer.text
    replies = answer.json()
    assert [reply["id"] for reply in replies] == ["first", 2, None, 3, 4], replies
    assert get_data_parts_of(replies[0]) == [{"order_id": "SO-7", "total_cents": 250}]
    assert [reply.get("error", {}).get("code") for reply in replies[1:]] == [-32001, -32600, -32601, -32600]

    assert rpc(stack, PRICE, [notification, notification]).status_code == 204
    empty = rpc(stack, PRICE, []).json()
    assert (empty["id"], empty["error"]["code"]) == (None, -32600)
    too_many = rpc(stack, PRICE, [notification] * 101).json()
    assert too_many["error"]["code"] == -32600


def get_data_parts_of(reply: dict[str, Any]) -> list[Any]:
    return [part["data"] for part in reply["result"]["message"]["parts"]]


def test_cards_carry_caching_headers_and_answer_conditional_requests(stack: Stack, agent: Agent) -> None:
    del agent
    url = f"{stack.router.url}/a2a/{PRICE}/.well-known/agent-card.json"
    card = httpx.get(url)
    assert card.status_code == 200
    assert "max-age=" in card.headers["cache-control"], card.headers
    etag = card.headers["etag"]
    assert etag.startswith('"'), etag
    assert etag.endswith('"'), etag
    assert httpx.get(url).headers["etag"] == etag
    same = httpx.get(url, headers={"if-none-match": etag})
    assert (same.status_code, same.content, same.headers["etag"]) == (304, b"", etag)
    assert httpx.get(url, headers={"if-none-match": f'W/"other", {etag}'}).status_code == 304
    assert httpx.get(url, headers={"if-none-match": '"other"'}).status_code == 200


def test_a_stream_has_the_servers_task_id_and_marks_its_last_chunk(stack: Stack, agent: Agent) -> None:
    del agent

    async def go() -> None:
        async with connect(stack, TOKENS, streaming=True) as client:
            message = new_data_message({"text": "can it ship today"}, role=Role.ROLE_USER)
            events = [event async for event in client.send_message(SendMessageRequest(message=message))]
            again = [event async for event in client.send_message(SendMessageRequest(message=message))]
        kinds = [event.WhichOneof("payload") for event in events]
        assert kinds == ["task"] + ["artifact_update"] * 4 + ["status_update"], kinds
        task_id = events[0].task.id
        assert task_id
        assert task_id != message.message_id
        assert again[0].task.id != task_id
        chunks = [event.artifact_update for event in events[1:5]]
        assert [chunk.append for chunk in chunks] == [False, True, True, True]
        assert [chunk.last_chunk for chunk in chunks] == [False, False, False, True]
        assert [get_data_parts(chunk.artifact.parts) for chunk in chunks] == [
            [{"token": word}] for word in ["can", "it", "ship", "today"]
        ]
        assert all(chunk.task_id == task_id for chunk in chunks)
        assert events[5].status_update.task_id == task_id

    asyncio.run(go())


def test_cards_are_signed_and_the_official_sdks_verifier_checks_them(stack: Stack, agent: Agent) -> None:
    """The card's signature (A2A §8.4) verifies with a2a-sdk's own verifier,
    the key found from the `kid` and `jku` the signature names; an edited card does not."""
    del agent
    jwks_url = f"{stack.router.url}/.well-known/jwks.json"
    asked: list[tuple[str | None, str | None]] = []

    def key_provider(kid: str | None, jku: str | None) -> jwt.PyJWK:
        asked.append((kid, jku))
        assert jku == jwks_url
        assert kid is not None
        return jwt.PyJWKSet.from_dict(httpx.get(jku).json())[kid]

    verifier = create_signature_verifier(key_provider, algorithms=["EdDSA"])

    async def resolve() -> AgentCard:
        async with httpx.AsyncClient(timeout=10) as http:
            resolver = A2ACardResolver(http, f"{stack.router.url}/a2a/{PRICE}")
            return await resolver.get_agent_card(signature_verifier=verifier)

    card = asyncio.run(resolve())
    assert card.name == PRICE
    (signature,) = card.signatures
    (kid, _), *_ = asked
    assert kid == httpx.get(jwks_url).json()["keys"][0]["kid"]
    assert signature.protected

    served = httpx.get(f"{stack.router.url}/a2a/{PRICE}/.well-known/agent-card.json").json()
    edited = {**served, "description": "Prices orders, and sends the card's caller elsewhere."}
    with pytest.raises(InvalidSignaturesError):
        verifier(parse_agent_card(edited))
    unsigned = {key: value for key, value in served.items() if key != "signatures"}
    with pytest.raises(NoSignatureError):
        verifier(parse_agent_card(unsigned))
