"""Multi-turn A2A tasks (issue 34), driven by the official ``a2a-sdk`` client against a
Python SDK agent that asks for more input (``InputRequired``): the task goes
``input-required`` with the agent's question, a message carrying its ``taskId`` continues
the same task (same ``contextId``), the agent reads the conversation so far
(``ctx.history``), the history grows with each turn and ``historyLength`` applies; a task
that ended, one that is not the caller's and a ``contextId`` of another task are refused
as the spec says. Over the blocking send, the stream, and the REST binding."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_message
from a2a.types import (
    GetTaskRequest,
    Role,
    SendMessageRequest,
    Task,
    TaskNotFoundError,
    TaskState,
    UnsupportedOperationError,
)
from pydantic import BaseModel

from agent_reach import Agent, Ctx, InputRequired

from .conftest import make_agent
from .support.stack import Stack

CAPABILITY = "test.shirt"


class Shirt(BaseModel):
    style: str | None = None
    size: str | None = None
    color: str | None = None


class Ordered(BaseModel):
    style: str
    size: str
    color: str
    turns: int


def shirt_agent(stack: Stack) -> Agent:
    """Asks for what the order still lacks, reading the conversation so far."""
    agent = make_agent(stack, name="py_agent")

    @agent.handler(CAPABILITY, version="1.0.0")
    async def order(shirt: Shirt, ctx: Ctx) -> Ordered:
        """Order a shirt, asking for its size and color."""
        known: dict[str, Any] = {}
        for turn in ctx.history:
            if turn.role == "user" and isinstance(turn.payload, dict):
                known.update({key: value for key, value in turn.payload.items() if value is not None})
        known.update(shirt.model_dump(exclude_none=True))
        for needed in ("size", "color"):
            if needed not in known:
                raise InputRequired(f"Which {needed}?")
        return Ordered(
            style=known.get("style", "tee"), size=known["size"], color=known["color"], turns=len(ctx.history)
        )

    return agent


@pytest.fixture
def shirts(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    start_agent(shirt_agent(stack))


@contextlib.asynccontextmanager
async def connect(stack: Stack, caller: str = "tester", **config: Any) -> AsyncIterator[Any]:
    http = httpx.AsyncClient(headers={"authorization": f"Bearer {stack.token(caller)}"}, timeout=15)
    try:
        settings = {"streaming": False, **config}
        yield await create_client(
            f"{stack.router.url}/a2a/{CAPABILITY}", client_config=ClientConfig(httpx_client=http, **settings)
        )
    finally:
        await http.aclose()


async def say(client: Any, data: dict[str, Any], task: Task | None = None, context_id: str | None = None) -> list[Any]:
    """Sends one message (continuing `task` when given); every answer it yields."""
    message = new_data_message(
        data,
        role=Role.ROLE_USER,
        task_id=task.id if task is not None else None,
        context_id=context_id if context_id is not None else (task.context_id if task is not None else None),
    )
    return [answer async for answer in client.send_message(SendMessageRequest(message=message))]


def question(task: Task) -> str:
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
    return " ".join(get_text_parts(task.status.message.parts))


def test_a_task_asks_for_input_and_each_message_continues_it(stack: Stack, shirts: None) -> None:
    async def scenario() -> str:
        async with connect(stack) as client:
            first = (await say(client, {"style": "polo"}))[0].task
            assert first.id.startswith("t_"), first
            assert question(first) == "Which size?"
            assert first.status.message.role == Role.ROLE_AGENT
            assert (first.status.message.task_id, first.status.message.context_id) == (first.id, first.context_id)

            second = (await say(client, {"size": "L"}, first))[0].task
            assert (second.id, second.context_id) == (first.id, first.context_id), "the same task"
            assert question(second) == "Which color?"

            third = (await say(client, {"color": "navy"}, second))[0].task
            assert third.id == first.id
            assert third.status.state == TaskState.TASK_STATE_COMPLETED, third
            output = get_data_parts(third.artifacts[0].parts)[0]
            # The agent saw the whole conversation before the last message: 2 questions, 2 answers.
            assert output == {"style": "polo", "size": "L", "color": "navy", "turns": 4.0}

            # The history grew with each turn: user, agent, user, agent, user.
            whole = await client.get_task(GetTaskRequest(id=first.id))
            roles = [message.role for message in whole.history]
            assert roles == [Role.ROLE_USER, Role.ROLE_AGENT] * 2 + [Role.ROLE_USER], whole.history
            assert get_text_parts(whole.history[1].parts) == ["Which size?"]
            assert get_data_parts(whole.history[2].parts) == [{"size": "L"}]
            assert all(message.task_id == first.id for message in whole.history)
            # historyLength keeps the most recent messages; 0 none.
            last_two = await client.get_task(GetTaskRequest(id=first.id, history_length=2))
            assert [message.role for message in last_two.history] == [Role.ROLE_AGENT, Role.ROLE_USER]
            assert get_data_parts(last_two.history[1].parts) == [{"color": "navy"}]
            assert not (await client.get_task(GetTaskRequest(id=first.id, history_length=0))).history

            # A task that ended takes no further message (spec §3.1.1).
            with pytest.raises(UnsupportedOperationError):
                await say(client, {"color": "red"}, third)
            # Nor does a task id that is not one.
            with pytest.raises(TaskNotFoundError):
                await say(client, {"size": "S"}, Task(id="t_000000000000000000000000", context_id=first.context_id))
        return first.id

    task_id = asyncio.run(scenario())
    # The same task on the slow path's own API, with its turns.
    view = httpx.get(
        f"{stack.router.url}/v1/tasks/{task_id}", headers={"authorization": f"Bearer {stack.token('tester')}"}
    ).json()
    assert view["status"] == "succeeded", view
    assert [turn["role"] for turn in view["turns"]] == ["agent", "user", "agent", "user"]
    statuses = [transition["status"] for transition in view["transitions"]]
    assert statuses.count("input_required") == 2, statuses


def test_a_continued_task_is_the_callers_and_keeps_its_context(stack: Stack, shirts: None) -> None:
    async def scenario() -> None:
        async with connect(stack) as client, connect(stack, caller="py_agent") as other:
            asked = (await say(client, {"style": "tee"}))[0].task
            assert question(asked) == "Which size?"
            # Another caller's message naming it: not found (no task of theirs).
            with pytest.raises(TaskNotFoundError):
                await say(other, {"size": "M"}, asked)
            # A contextId that is not the task's is refused (spec §3.4.3), the task still waits.
            with pytest.raises(Exception, match="not the context of task"):
                await say(client, {"size": "M"}, asked, context_id="another-context")
            # A payload its input schema refuses is the caller's error; the task still waits.
            with pytest.raises(Exception, match="input schema"):
                await say(client, {"size": 5}, asked)
            waiting = await client.get_task(GetTaskRequest(id=asked.id))
            assert question(waiting) == "Which size?"
            continued = (await say(client, {"size": "M", "color": "red"}, asked))[0].task
            assert continued.status.state == TaskState.TASK_STATE_COMPLETED, continued

    asyncio.run(scenario())


def test_a_streamed_conversation_ends_each_stream_when_the_agent_asks(stack: Stack, shirts: None) -> None:
    async def scenario() -> None:
        async with connect(stack, streaming=True) as client:
            events = await say(client, {"style": "henley"})
            # The stream carries the task asking for input, then ends (an interrupted state).
            asked = events[-1].task if events[-1].HasField("task") else None
            assert asked is not None, events
            assert question(asked) == "Which size?"
            events = await say(client, {"size": "XL"}, asked)
            kinds = [event.WhichOneof("payload") for event in events]
            assert kinds[0] == "task", kinds
            assert events[0].task.id == asked.id
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, events
            events = await say(client, {"color": "green"}, asked)
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED, events
            artifacts = [event for event in events if event.HasField("artifact_update")]
            assert get_data_parts(artifacts[0].artifact_update.artifact.parts)[0]["size"] == "XL"

    asyncio.run(scenario())


def test_the_rest_binding_continues_a_task_as_json_rpc_does(stack: Stack, shirts: None) -> None:
    async def scenario() -> None:
        async with connect(stack, supported_protocol_bindings=["HTTP+JSON"]) as client:
            asked = (await say(client, {"style": "tee"}))[0].task
            assert question(asked) == "Which size?"
            done = (await say(client, {"size": "S", "color": "black"}, asked))[0].task
            assert (done.id, done.status.state) == (asked.id, TaskState.TASK_STATE_COMPLETED)
            with pytest.raises(UnsupportedOperationError):
                await say(client, {"size": "S"}, done)

    asyncio.run(scenario())


def test_a_plain_invoke_caller_sees_the_question_as_the_agents_error(stack: Stack, shirts: None) -> None:
    answer = httpx.post(
        f"{stack.router.url}/v1/invoke",
        json={"capability": CAPABILITY, "payload": {"style": "tee"}},
        headers={"authorization": f"Bearer {stack.token('tester')}"},
        timeout=15,
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["message"]) == ("AGENT_ERROR", "Which size?")
    assert error["details"]["agent_code"] == "INPUT_REQUIRED"
