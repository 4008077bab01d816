"""Streaming handlers (async generators) through the real router (DESIGN §8,
"Streaming"): items reach the caller one by one while the handler still runs (it
waits for the test between items: ordering, not timing), an error after the first item
is ``event: error``, a caller that goes away cancels the handler, and a caller that did
not ask for events gets the items as a list."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
from pydantic import BaseModel

from agent_reach import Agent, HandlerError

from .conftest import make_agent
from .support.stack import Stack, wait_until


class Prompt(BaseModel):
    text: str


class Token(BaseModel):
    token: str


def events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event name, decoded data) for each server-sent event, as it arrives."""
    name, data = "message", ""
    for line in lines:
        if line == "":
            yield name, json.loads(data)
            name, data = "message", ""
        elif line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data += line[len("data: ") :]


def test_async_generators_stream_their_items_through_the_router(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    gate = threading.Event()
    cancelled = threading.Event()
    agent = make_agent(stack)

    @agent.handler("test.tokens", version="1.0.0")
    async def tokens(payload: Prompt) -> AsyncIterator[Token]:
        """Streams the words of a prompt."""
        try:
            if payload.text == "refuse":
                raise HandlerError("REFUSED", "not this prompt")
            yield Token(token="first")
            if payload.text == "hold":
                await asyncio.Event().wait()  # until cancelled
            if payload.text == "fail":
                raise HandlerError("MODEL_FAILED", "the model gave up")
            if not payload.text.startswith("collect"):
                await asyncio.to_thread(gate.wait, 10)
            for word in payload.text.split(" "):
                yield Token(token=word)
        except (GeneratorExit, asyncio.CancelledError):
            cancelled.set()
            raise

    start_agent(agent)
    record = stack.instance(agent.agent_id)
    assert record is not None
    output_schema = record["capabilities"][0]["output_schema"]
    assert output_schema["type"] == "array", output_schema

    # Not asked for events: the items as a list.
    answer = invoke("test.tokens", {"text": "collect two"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"] == [{"token": "first"}, {"token": "collect"}, {"token": "two"}]

    url = f"{stack.router.url}/v1/invoke"
    headers = {"authorization": f"Bearer {stack.token('tester')}", "accept": "text/event-stream"}

    def body(text: str) -> dict[str, Any]:
        return {"capability": "test.tokens", "payload": {"text": text}, "timeout_ms": 10_000}

    with httpx.stream("POST", url, json=body("hello world"), headers=headers, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        stream = events(response.iter_lines())
        # Here while the handler waits at the gate: relayed, not buffered.
        assert next(stream) == ("message", {"token": "first"})
        gate.set()
        assert next(stream) == ("message", {"token": "hello"})
        assert next(stream) == ("message", {"token": "world"})
        name, result = next(stream)
        assert name == "result", result
        assert result["agent_id"] == agent.agent_id
        assert result["events"] == 3

    with httpx.stream("POST", url, json=body("fail"), headers=headers, timeout=10) as response:
        stream = events(response.iter_lines())
        assert next(stream) == ("message", {"token": "first"})
        name, error = next(stream)
        assert name == "error", error
        assert error["code"] == "AGENT_ERROR"
        assert error["details"]["agent_code"] == "MODEL_FAILED"
        assert error["message"] == "the model gave up"

    # An error before the first item: an ordinary failed envelope with the handler's status.
    refused = httpx.post(url, json=body("refuse"), headers=headers, timeout=10)
    assert refused.status_code == 422, refused.text
    assert "REFUSED" in refused.text

    # The caller goes away: the handler is cancelled (its generator closed).
    cancelled.clear()
    with httpx.stream("POST", url, json=body("hold"), headers=headers, timeout=10) as response:
        stream = events(response.iter_lines())
        assert next(stream) == ("message", {"token": "first"})
    wait_until(cancelled.is_set, 10, "the handler cancelled after its caller left")
