"""A2A tasks on the router's slow path (``/a2a/{capability}``, DESIGN §8), driven by the
official ``a2a-sdk`` client: a ``SendMessage`` that returns at once is a durable task whose
state follows the delivery (get, subscribe, list), cancel maps to the task's cancel, tasks
are their caller's only, and push-notification configs are the task's signed callback.
A held-open agent (a handler waiting on an event) makes every state observable without
sleeping; every wait polls a condition with a bound."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_data_parts, new_data_message
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
)
from pydantic import BaseModel, Field

from agent_reach import Agent

from .conftest import make_agent
from .support.stack import Stack, free_port, wait_until

CAPABILITY = "test.a2a_slow"


class Order(BaseModel):
    order_id: str = Field(min_length=3)


class Priced(BaseModel):
    order_id: str
    total_cents: int


def held_agent(stack: Stack, release: threading.Event) -> Agent:
    """An agent whose answer waits until ``release`` is set (at most 20 s)."""
    agent = make_agent(stack, name="py_agent")

    @agent.handler(CAPABILITY, version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order, once released."""
        await asyncio.to_thread(release.wait, 20)
        return Priced(order_id=payload.order_id, total_cents=700)

    return agent


@pytest.fixture
def release(stack: Stack, start_agent: Callable[..., Agent]) -> Iterator[threading.Event]:
    event = threading.Event()
    start_agent(held_agent(stack, event))
    yield event
    event.set()


@contextlib.asynccontextmanager
async def connect(
    stack: Stack, caller: str = "tester", push: TaskPushNotificationConfig | None = None, *, streaming: bool = False
) -> AsyncIterator[Any]:
    """An a2a-sdk client that asks for tasks at once (``polling``), as ``caller``; ``streaming``
    lets it subscribe (the client subscribes only when both it and the card stream)."""
    http = httpx.AsyncClient(headers={"authorization": f"Bearer {stack.token(caller)}"}, timeout=10)
    try:
        config = ClientConfig(httpx_client=http, streaming=streaming, polling=True, push_notification_config=push)
        yield await create_client(f"{stack.router.url}/a2a/{CAPABILITY}", client_config=config)
    finally:
        await http.aclose()


async def submit(client: Any, order_id: str) -> Task:
    request = SendMessageRequest(message=new_data_message({"order_id": order_id}, role=Role.ROLE_USER))
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1, answers
    assert answers[0].HasField("task"), answers
    return answers[0].task


async def poll_state(client: Any, task_id: str, state: int) -> Task:
    """Polls GetTask until the task is in ``state`` (10 s at most)."""
    for _ in range(500):
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state == state:
            return task
        await asyncio.sleep(0.02)
    raise AssertionError(f"task {task_id} never reached {TaskState.Name(state)}")


def test_a_task_follows_its_durable_task_through_get_subscribe_and_list(stack: Stack, release: threading.Event) -> None:
    async def scenario() -> None:
        async with connect(stack) as client, connect(stack, streaming=True) as streamed:
            task = await submit(client, "SO-41")
            assert task.id.startswith("t_"), task
            assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
            await poll_state(client, task.id, TaskState.TASK_STATE_WORKING)

            events: list[Any] = []

            async def follow() -> None:
                async for event in streamed.subscribe(SubscribeToTaskRequest(id=task.id)):
                    events.append(event)

            following = asyncio.create_task(follow())
            # The subscription's first event (the task, working) arrives before the agent answers.
            for _ in range(500):
                if events:
                    break
                await asyncio.sleep(0.02)
            assert events, "no event before the agent answered"
            assert events[0].task.status.state == TaskState.TASK_STATE_WORKING, events
            release.set()
            await asyncio.wait_for(following, 15)
            kinds = [event.WhichOneof("payload") for event in events]
            assert kinds == ["task", "artifact_update", "status_update"], events
            assert get_data_parts(events[1].artifact_update.artifact.parts) == [
                {"order_id": "SO-41", "total_cents": 700}
            ]
            assert events[2].status_update.status.state == TaskState.TASK_STATE_COMPLETED

            done = await client.get_task(GetTaskRequest(id=task.id))
            assert done.status.state == TaskState.TASK_STATE_COMPLETED
            assert get_data_parts(done.artifacts[0].parts) == [{"order_id": "SO-41", "total_cents": 700}]
            # A task that ended has nothing to subscribe to.
            with pytest.raises(UnsupportedOperationError):
                async for _ in streamed.subscribe(SubscribeToTaskRequest(id=task.id)):
                    pass

            listed = await client.list_tasks(ListTasksRequest())
            assert task.id in [listed_task.id for listed_task in listed.tasks]
            completed = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=1))
            assert len(completed.tasks) == 1
            assert completed.total_size >= 1
            working = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
            assert task.id not in [listed_task.id for listed_task in working.tasks]

        # Tasks are their caller's: py_agent may call the capability, yet sees none of tester's tasks.
        async with connect(stack, caller="py_agent") as other:
            with pytest.raises(TaskNotFoundError):
                await other.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await other.cancel_task(CancelTaskRequest(id=task.id))
            theirs = await other.list_tasks(ListTasksRequest())
            assert task.id not in [listed_task.id for listed_task in theirs.tasks]

    asyncio.run(scenario())


def test_cancel_maps_to_the_durable_tasks_cancel(stack: Stack, release: threading.Event) -> None:
    async def scenario() -> str:
        async with connect(stack) as client:
            task = await submit(client, "SO-42")
            await poll_state(client, task.id, TaskState.TASK_STATE_WORKING)
            canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            assert canceled.status.message.metadata["error"]["code"] == "CANCELED"
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task.id))
            release.set()
            # The agent's late answer does not revive it.
            assert (await client.get_task(GetTaskRequest(id=task.id))).status.state == TaskState.TASK_STATE_CANCELED

        return task.id

    task_id = asyncio.run(scenario())
    # The same task on the slow path's own API.
    status = httpx.get(
        f"{stack.router.url}/v1/tasks/{task_id}", headers={"authorization": f"Bearer {stack.token('tester')}"}
    )
    assert status.json()["status"] == "canceled"


class Receiver:
    """A loopback webhook that keeps every POST (headers and body)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        received = self.received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                received.append(({key.lower(): value for key, value in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_push_notification_configs_are_kept_with_the_task_and_each_is_notified(
    stack: Stack, release: threading.Event
) -> None:
    receiver = Receiver()
    secret = (stack.directory / "callback.secret").read_bytes().strip()

    async def scenario() -> str:
        push = TaskPushNotificationConfig(url=receiver.url)
        async with connect(stack, push=push) as client:
            task = await submit(client, "SO-43")
            # A config sent without an id gets one the server makes (spec §3.1.7).
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
            assert [config.url for config in listed.configs] == [receiver.url]
            made = listed.configs[0].id
            assert made, listed
            config = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id=made)
            )
            assert (config.task_id, config.id, config.url) == (task.id, made, receiver.url)

        async with connect(stack) as client:
            # Created, listed, deleted and created again on a task still running.
            other = await submit(client, "SO-44")
            created = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=other.id, url=receiver.url)
            )
            assert created.url == receiver.url
            assert created.id
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=other.id)
            )
            assert [config.id for config in listed.configs] == [created.id]
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=other.id, id=created.id)
            )
            assert not (
                await client.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=other.id)
                )
            ).configs
            # A config that does not exist is TaskNotFound (spec §3.1.8), to get or to delete.
            with pytest.raises(TaskNotFoundError):
                await client.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=other.id, id=created.id)
                )
            with pytest.raises(TaskNotFoundError):
                await client.delete_task_push_notification_config(
                    DeleteTaskPushNotificationConfigRequest(task_id=other.id, id=created.id)
                )
            # The client's ids, token and authentication: kept, and sent back with the notification.
            created = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(
                    task_id=other.id,
                    id="hook-44",
                    url=receiver.url,
                    token="t0k",
                    authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-secret"),
                )
            )
            assert (created.id, created.token, created.authentication.scheme) == ("hook-44", "t0k", "Bearer")
            assert not created.authentication.credentials  # write-only
            got = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=other.id, id="hook-44")
            )
            assert (got.id, got.url, got.token) == ("hook-44", receiver.url, "t0k")
            # Several per task, each by its id; the same id again replaces it.
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=other.id, id="hook-2", url=receiver.url, token="old")
            )
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=other.id, id="hook-2", url=receiver.url, token="second")
            )
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=other.id)
            )
            assert [(config.id, config.token) for config in listed.configs] == [
                ("hook-2", "second"),
                ("hook-44", "t0k"),
            ]
            release.set()
            await poll_state(client, task.id, TaskState.TASK_STATE_COMPLETED)
            await poll_state(client, other.id, TaskState.TASK_STATE_COMPLETED)
            # A task that ended still takes a config (and is notified of nothing more).
            late = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=other.id, id="late", url=receiver.url)
            )
            assert late.id == "late"
        return f"{task.id} {other.id}"

    try:
        ids = asyncio.run(scenario()).split()
        wait_until(lambda: len(receiver.received) >= 3, 15, "three push notifications")
        by_token: dict[str | None, tuple[dict[str, str], bytes]] = {
            headers.get("x-a2a-notification-token"): (headers, body) for headers, body in receiver.received
        }
        assert sorted(by_token, key=str) == sorted([None, "t0k", "second"], key=str), list(by_token)
        assert sorted(headers["x-agent-reach-task-id"] for headers, _ in receiver.received) == sorted(
            [ids[0], ids[1], ids[1]]
        )
        for headers, body in by_token.values():
            fields = dict(part.split("=", 1) for part in headers["x-agent-reach-signature"].split(","))
            expected = hmac.new(secret, f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
            assert hmac.compare_digest(fields["v1"], expected)
            assert b'"total_cents":700' in body
            # The notification is the task as a StreamResponse (spec §4.3.3).
            assert headers["content-type"] == "application/a2a+json"
            notified = json.loads(body)["task"]
            assert notified["id"] == headers["x-agent-reach-task-id"]
            assert notified["status"]["state"] == "TASK_STATE_COMPLETED"
        # The second task's config asked for its credentials back; the other ones none.
        assert by_token["t0k"][0]["authorization"] == "Bearer receiver-secret"
        assert "authorization" not in by_token["second"][0]
        assert by_token[None][0]["x-agent-reach-task-id"] == ids[0]
    finally:
        receiver.close()


def rpc(stack: Stack, body: Any, caller: str = "tester") -> dict[str, Any]:
    answer = httpx.post(
        f"{stack.router.url}/a2a/{CAPABILITY}",
        json=body,
        headers={"authorization": f"Bearer {stack.token(caller)}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("GetTask", {"id": "t_000000000000000000000000"}, -32001),
        ("CancelTask", {"id": "t_000000000000000000000000"}, -32001),
        ("SubscribeToTask", {"id": "t_000000000000000000000000"}, -32001),
        ("CancelTask", {}, -32602),
        ("ListTasks", {"pageSize": 1000}, -32602),
        ("ListTasks", {"pageToken": "not-a-token"}, -32602),
        ("ListTasks", {"statusTimestampAfter": "yesterday"}, -32602),
        ("ListTasks", {"pageSize": 0}, -32602),
        ("ListTasks", {"status": "TASK_STATE_DONE"}, -32602),
        ("ListTasks", {"historyLength": -1}, -32602),
        ("ListTasks", {"includeArtifacts": "yes"}, -32602),
        ("GetTask", {"id": "t_000000000000000000000000", "historyLength": -1}, -32602),
        ("CreateTaskPushNotificationConfig", {"taskId": "t_000000000000000000000000"}, -32602),
        ("CreateTaskPushNotificationConfig", {"taskId": "t_000000000000000000000000", "url": "http://x"}, -32001),
        ("GetTaskPushNotificationConfig", {"taskId": "t_000000000000000000000000", "id": "default"}, -32001),
        ("DeleteTaskPushNotificationConfig", {"id": "default"}, -32602),
        (
            "SendMessage",
            {
                "message": {"messageId": "m-bad-push", "role": "ROLE_USER", "parts": [{"data": {"order_id": "SO-9"}}]},
                "configuration": {"taskPushNotificationConfig": {"url": "ftp://example.com/hook"}},
            },
            -32602,
        ),
    ],
)
def test_bad_input_on_the_task_methods_is_an_a2a_error(
    stack: Stack, release: threading.Event, method: str, params: dict[str, Any], code: int
) -> None:
    answer = rpc(stack, {"jsonrpc": "2.0", "id": 3, "method": method, "params": params})
    assert answer["error"]["code"] == code, answer


def test_v0_3_task_methods_answer_in_v0_3_shapes(stack: Stack, release: threading.Event) -> None:
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m-legacy-task",
                "role": "user",
                "parts": [{"kind": "data", "data": {"order_id": "SO-45"}}],
            },
            "configuration": {"blocking": False},
        },
    }
    task = rpc(stack, send)["result"]
    assert task["kind"] == "task", task
    assert task["status"]["state"] in ("submitted", "working"), task
    got = rpc(stack, {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}})["result"]
    assert got["id"] == task["id"]
    assert got["kind"] == "task"
    canceled = rpc(stack, {"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": task["id"]}})
    assert canceled["result"]["status"]["state"] == "canceled", canceled
    again = rpc(stack, {"jsonrpc": "2.0", "id": 4, "method": "tasks/cancel", "params": {"id": task["id"]}})
    assert again["error"]["code"] == -32002


def test_history_filters_continuation_and_notifications_on_durable_tasks(
    stack: Stack, release: threading.Event
) -> None:
    asked = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": "m-history-1", "role": "ROLE_USER", "parts": [{"data": {"order_id": "SO-61"}}]},
            "configuration": {"returnImmediately": True, "historyLength": 0},
        },
    }
    task = rpc(stack, asked)["result"]["task"]
    assert "history" not in task, task
    task_id = task["id"]

    def get(**params: Any) -> dict[str, Any]:
        return rpc(stack, {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task_id, **params}})

    # The history is the message that started the task.
    (message,) = get()["result"]["history"]
    assert message["messageId"] == "m-history-1"
    assert (message["role"], message["taskId"]) == ("ROLE_USER", task_id)
    assert message["parts"] == [{"data": {"order_id": "SO-61"}}]
    assert len(get(historyLength=5)["result"]["history"]) == 1
    assert "history" not in get(historyLength=0)["result"]

    # A running task takes no message (it never asks for input); nor does one that ended.
    def continue_with(params: dict[str, Any]) -> dict[str, Any]:
        message = {"messageId": f"m-{params}", "role": "ROLE_USER", "parts": [{"data": {"order_id": "SO-62"}}]}
        body = {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": {**message, **params}}}
        return rpc(stack, body)

    running = continue_with({"taskId": task_id})
    assert running["error"]["code"] == -32004, running
    assert running["error"]["data"][0]["reason"] == "UNSUPPORTED_OPERATION"
    wrong_context = continue_with({"taskId": task_id, "contextId": "another-context"})
    assert wrong_context["error"]["code"] == -32602, wrong_context

    # statusTimestampAfter keeps tasks updated at or after the time.
    def listed(**params: Any) -> list[str]:
        answer = rpc(stack, {"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": params})
        return [listed_task["id"] for listed_task in answer["result"]["tasks"]]

    assert task_id in listed(statusTimestampAfter="2000-01-01T00:00:00Z")
    assert task_id in listed(statusTimestampAfter="2000-01-01T02:00:00.5+02:00")
    assert task_id not in listed(statusTimestampAfter="2999-01-01T00:00:00Z")
    assert task_id in listed(status=2)  # TASK_STATE_WORKING, by number as ProtoJSON allows
    page = rpc(stack, {"jsonrpc": "2.0", "id": 5, "method": "ListTasks", "params": {"includeArtifacts": True}})
    assert all("artifacts" in listed_task for listed_task in page["result"]["tasks"]), page
    assert all("history" not in listed_task for listed_task in page["result"]["tasks"]), page
    with_history = rpc(stack, {"jsonrpc": "2.0", "id": 6, "method": "ListTasks", "params": {"historyLength": 1}})
    assert all(len(listed_task["history"]) == 1 for listed_task in with_history["result"]["tasks"])

    # A notification is performed and answered with nothing: this one cancels the task.
    cancel = {"jsonrpc": "2.0", "method": "CancelTask", "params": {"id": task_id}}
    answer = httpx.post(
        f"{stack.router.url}/a2a/{CAPABILITY}",
        json=cancel,
        headers={"authorization": f"Bearer {stack.token('tester')}"},
        timeout=10,
    )
    assert (answer.status_code, answer.content) == (204, b"")
    assert get()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    ended = continue_with({"taskId": task_id})
    assert ended["error"]["code"] == -32004, ended
    assert "canceled" in ended["error"]["message"]
    release.set()


def test_push_configs_take_protojson_snake_case_names(stack: Stack, release: threading.Event) -> None:
    receiver = Receiver()
    try:
        send = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {
                "message": {"message_id": "m-snake", "role": "ROLE_USER", "parts": [{"data": {"order_id": "SO-71"}}]},
                "configuration": {"return_immediately": True},
            },
        }
        task = rpc(stack, send)
        assert "result" in task, task
        task_id = task["result"]["task"]["id"]
        created = rpc(
            stack,
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "CreateTaskPushNotificationConfig",
                "params": {"task_id": task_id, "id": "snake", "url": receiver.url, "token": "s"},
            },
        )
        assert created["result"]["id"] == "snake", created
        got = rpc(
            stack,
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "GetTaskPushNotificationConfig",
                "params": {"task_id": task_id, "id": "snake"},
            },
        )
        assert got["result"]["token"] == "s", got
        bad = rpc(
            stack,
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "CreateTaskPushNotificationConfig",
                "params": {"taskId": task_id, "id": "snake", "url": receiver.url, "token": "two\nlines"},
            },
        )
        assert bad["error"]["code"] == -32602, bad
        release.set()
    finally:
        receiver.close()


def test_with_a2a_tasks_always_every_message_is_a_durable_task(stack: Stack, release: threading.Event) -> None:
    """``--a2a-tasks always``: a plain send is answered with its ended Task, a stream is the
    task's, and GetTask and ListTasks find both (the TCK's reading of the spec)."""
    directory = stack.directory
    router = stack.start_router(
        [
            "--a2a-tasks",
            "always",
            "--redis",
            stack.redis.url,
            "--callback-secret-file",
            str(directory / "callback.secret"),
            "--allow-private-callbacks",
            "--assertion-key",
            str(directory / "assertion.pem"),
        ]
    )
    try:
        url = f"{router.url}/a2a/{CAPABILITY}"
        headers = {"authorization": f"Bearer {stack.token('tester')}"}
        wait_until(
            lambda: httpx.get(f"{url}/.well-known/agent-card.json", timeout=5).status_code == 200,
            20,
            "the router's card",
        )
        release.set()  # the held agent answers at once
        message = {"messageId": "m-always-1", "role": "ROLE_USER", "parts": [{"data": {"order_id": "SO-81"}}]}
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        answer = httpx.post(url, json=body, headers=headers, timeout=30).json()
        task = answer["result"]["task"]
        assert task["id"].startswith("t_"), answer
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
        assert task["artifacts"][0]["parts"] == [{"data": {"order_id": "SO-81", "total_cents": 700}}]
        assert task["history"][0]["messageId"] == "m-always-1"

        streamed_message = {**message, "messageId": "m-always-2"}
        stream = {"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": {"message": streamed_message}}
        with httpx.stream("POST", url, json=stream, headers=headers, timeout=30) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        first = json.loads(events[0][len("data: ") :])["result"]["task"]
        assert first["id"].startswith("t_"), first
        got = httpx.post(
            url,
            json={"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": first["id"]}},
            headers=headers,
            timeout=10,
        ).json()
        assert got["result"]["id"] == first["id"], got
        listed = httpx.post(
            url, json={"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": {}}, headers=headers, timeout=10
        ).json()
        ids = [listed_task["id"] for listed_task in listed["result"]["tasks"]]
        assert task["id"] in ids
        assert first["id"] in ids
    finally:
        router.stop()
