"""The three A2A bindings are one agent (spec §5.1, issue 34): the official ``a2a-sdk``
client runs the same scenario over JSON-RPC, HTTP+JSON and gRPC (``grpcio``, the router's
own listener over h2c, the capability in ``tenant`` as the card's GRPC interface says) and
gets the same tasks and the same errors: a plain message, a multi-turn task asking for
input, its history, a listing, push configs, a stream, and each refusal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import AuthInterceptor, ClientCallContext, ClientConfig, CredentialService, create_client
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_message, new_text_message
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)

from agent_reach import Agent

from .support.stack import Stack
from .test_a2a_turns import CAPABILITY, shirt_agent

BINDINGS = ["JSONRPC", "HTTP+JSON", "GRPC"]


class Token(CredentialService):
    """The caller's bearer token for the card's `bearer` scheme: the official client's
    AuthInterceptor sends it as each binding does (a header, or gRPC metadata)."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def get_credentials(self, security_scheme_name: str, context: ClientCallContext | None) -> str | None:
        return self.token if security_scheme_name == "bearer" else None


@contextlib.asynccontextmanager
async def connect(stack: Stack, binding: str, *, streaming: bool = False) -> AsyncIterator[Any]:
    token = stack.token("tester")
    http = httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=15)
    channels: list[grpc.aio.Channel] = []

    def channel(url: str) -> grpc.aio.Channel:
        opened = grpc.aio.insecure_channel(url)
        channels.append(opened)
        return opened

    try:
        config = ClientConfig(
            httpx_client=http,
            streaming=streaming,
            supported_protocol_bindings=[binding],
            grpc_channel_factory=channel,
        )
        yield await create_client(
            f"{stack.router.url}/a2a/{CAPABILITY}", client_config=config, interceptors=[AuthInterceptor(Token(token))]
        )
    finally:
        await http.aclose()
        for opened in channels:
            await opened.close()


async def say(client: Any, message: Any) -> Any:
    answers = [answer async for answer in client.send_message(SendMessageRequest(message=message))]
    return answers[-1]


def shape(task: Task) -> dict[str, Any]:
    """What a task must be the same over every binding (its ids are its own)."""
    return {
        "state": TaskState.Name(task.status.state),
        "question": get_text_parts(task.status.message.parts) if task.status.HasField("message") else [],
        "history": [
            (Role.Name(message.role), get_data_parts(message.parts), get_text_parts(message.parts))
            for message in task.history
        ],
        "artifacts": [get_data_parts(artifact.parts) for artifact in task.artifacts],
    }


async def refusal(action: Any) -> str:
    try:
        await action
    except Exception as error:  # noqa: BLE001 - the error's class is what is compared
        return type(error).__name__
    return "no error"


async def scenario(stack: Stack, binding: str) -> list[Any]:
    seen: list[Any] = []
    async with connect(stack, binding) as client, connect(stack, binding, streaming=True) as streaming:
        asked = (await say(client, new_data_message({"style": "polo"}, role=Role.ROLE_USER))).task
        seen.append(shape(asked))
        more = (
            await say(
                client,
                new_data_message({"size": "M"}, role=Role.ROLE_USER, task_id=asked.id, context_id=asked.context_id),
            )
        ).task
        seen.append((more.id == asked.id, more.context_id == asked.context_id, shape(more)))
        done = (await say(client, new_data_message({"color": "teal"}, role=Role.ROLE_USER, task_id=asked.id))).task
        seen.append(shape(done))
        seen.append(shape(await client.get_task(GetTaskRequest(id=asked.id, history_length=2))))
        listed = await client.list_tasks(ListTasksRequest(context_id=asked.context_id, history_length=1))
        seen.append([(task.id == asked.id, shape(task)) for task in listed.tasks])

        # Push configs: several per task, by id.
        for config_id in ("hook-b", "hook-a"):
            created = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=asked.id, id=config_id, url="http://127.0.0.1:9/hook", token="t")
            )
            seen.append((created.id, created.task_id == asked.id, created.url, created.token))
        configs = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=asked.id)
        )
        seen.append([config.id for config in configs.configs])
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=asked.id, id="hook-a")
        )
        seen.append((got.id, got.url))
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=asked.id, id="hook-a")
        )

        # A streamed conversation: the task asking, then its updates.
        events = [
            event
            async for event in streaming.send_message(
                SendMessageRequest(message=new_data_message({"style": "henley", "size": "S"}, role=Role.ROLE_USER))
            )
        ]
        seen.append([event.WhichOneof("payload") for event in events])
        streamed = events[-1].task
        events = [
            event
            async for event in streaming.send_message(
                SendMessageRequest(message=new_data_message({"color": "red"}, role=Role.ROLE_USER, task_id=streamed.id))
            )
        ]
        seen.append(
            [
                (event.WhichOneof("payload"), TaskState.Name(event.status_update.status.state))
                for event in events
                if event.HasField("status_update")
            ]
        )

        # The same refusals, as the same errors.
        unknown = "t_000000000000000000000000"
        seen.append(await refusal(client.get_task(GetTaskRequest(id=unknown))))
        seen.append(await refusal(say(client, new_data_message({"size": "L"}, role=Role.ROLE_USER, task_id=asked.id))))
        seen.append(await refusal(client.cancel_task(CancelTaskRequest(id=asked.id))))
        seen.append(
            await refusal(
                client.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=asked.id, id="hook-a")
                )
            )
        )
        seen.append(await refusal(say(client, new_text_message("a shirt, please", role=Role.ROLE_USER))))
        seen.append(await refusal(say(client, new_data_message({"size": "L"}, role=Role.ROLE_USER, task_id=unknown))))
    return seen


@pytest.fixture
def shirts(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    start_agent(shirt_agent(stack))


def test_the_card_lists_every_binding(stack: Stack, shirts: None) -> None:
    card = httpx.get(f"{stack.router.url}/a2a/{CAPABILITY}/.well-known/agent-card.json").json()
    interfaces = {interface["protocolBinding"]: interface for interface in card["supportedInterfaces"]}
    assert sorted(interfaces) == sorted(BINDINGS)
    host = stack.router.url.removeprefix("http://")
    assert interfaces["GRPC"] == {
        "url": host,
        "protocolBinding": "GRPC",
        "protocolVersion": "1.0",
        "tenant": CAPABILITY,
    }


def test_the_three_bindings_give_the_same_tasks_and_errors(stack: Stack, shirts: None) -> None:
    results = {binding: asyncio.run(scenario(stack, binding)) for binding in BINDINGS}
    reference = results["JSONRPC"]
    # What the scenario saw, checked once: the rest must equal it.
    assert reference[0]["state"] == "TASK_STATE_INPUT_REQUIRED", reference
    assert reference[2]["artifacts"] == [[{"style": "polo", "size": "M", "color": "teal", "turns": 4}]], reference
    assert reference[-6:] == [
        "TaskNotFoundError",
        "UnsupportedOperationError",
        "TaskNotCancelableError",
        "TaskNotFoundError",
        "ContentTypeNotSupportedError",
        "TaskNotFoundError",
    ], reference
    for binding in ("HTTP+JSON", "GRPC"):
        assert results[binding] == reference, (binding, results[binding], reference)


def test_bad_input_on_the_grpc_binding_is_a_grpc_status_never_an_internal_error(stack: Stack, shirts: None) -> None:
    from a2a.types import a2a_pb2, a2a_pb2_grpc
    from google.rpc import error_details_pb2, status_pb2

    target = stack.router.url.removeprefix("http://")
    token = [("authorization", f"Bearer {stack.token('tester')}")]

    def refused(call: Callable[[], Any]) -> tuple[str, str | None]:
        """The status code of a refused call, and its ErrorInfo's reason (domain a2a-protocol.org) if any."""
        try:
            call()
        except grpc.RpcError as error:
            reason = None
            for key, value in error.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    status = status_pb2.Status.FromString(value)
                    for detail in status.details:
                        info = error_details_pb2.ErrorInfo()
                        if detail.Unpack(info) and info.domain == "a2a-protocol.org":
                            reason = info.reason
            return error.code().name, reason
        return "OK", None

    with grpc.insecure_channel(target) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        message = a2a_pb2.Message(message_id="m-1", role=a2a_pb2.Role.ROLE_USER)
        message.parts.add().text = "hi"
        send = a2a_pb2.SendMessageRequest(tenant=CAPABILITY, message=message)
        # Who and where: no token, no tenant, an agent that is none, a version not spoken.
        assert refused(lambda: stub.SendMessage(send)) == ("UNAUTHENTICATED", None)
        assert refused(lambda: stub.SendMessage(a2a_pb2.SendMessageRequest(message=message), metadata=token))[0] == (
            "INVALID_ARGUMENT"
        )
        unknown = a2a_pb2.SendMessageRequest(tenant="test.nobody", message=message)
        assert refused(lambda: stub.SendMessage(unknown, metadata=token))[0] == "NOT_FOUND"
        version = [*token, ("a2a-version", "9.9")]
        assert refused(lambda: stub.SendMessage(send, metadata=version)) == (
            "FAILED_PRECONDITION",
            "VERSION_NOT_SUPPORTED",
        )
        # What: no message, a message without its id, a part this agent does not take, bytes that are no message.
        assert refused(lambda: stub.SendMessage(a2a_pb2.SendMessageRequest(tenant=CAPABILITY), metadata=token))[0] == (
            "INVALID_ARGUMENT"
        )
        nameless = a2a_pb2.SendMessageRequest(
            tenant=CAPABILITY, message=a2a_pb2.Message(role=a2a_pb2.Role.ROLE_USER, parts=message.parts)
        )
        assert refused(lambda: stub.SendMessage(nameless, metadata=token))[0] == "INVALID_ARGUMENT"
        assert refused(lambda: stub.SendMessage(send, metadata=token)) == (
            "INVALID_ARGUMENT",
            "CONTENT_TYPE_NOT_SUPPORTED",
        )
        garbage = channel.unary_unary(
            "/lf.a2a.v1.A2AService/SendMessage",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        # A body that is no protobuf message: gRPC's own rule for a request it cannot parse is
        # INTERNAL (grpc/doc/statuscodes.md, "Error parsing request proto"), tonic's answer.
        assert refused(lambda: garbage(b"\xff\xff\xff\xff", metadata=token))[0] == "INTERNAL"
        # Tasks: one that is none (unary and streamed), bad list parameters.
        unknown_task = "t_000000000000000000000000"
        assert refused(
            lambda: stub.GetTask(a2a_pb2.GetTaskRequest(tenant=CAPABILITY, id=unknown_task), metadata=token)
        ) == (
            "NOT_FOUND",
            "TASK_NOT_FOUND",
        )
        subscribe = a2a_pb2.SubscribeToTaskRequest(tenant=CAPABILITY, id=unknown_task)
        assert refused(lambda: list(stub.SubscribeToTask(subscribe, metadata=token))) == ("NOT_FOUND", "TASK_NOT_FOUND")
        for bad in (
            a2a_pb2.ListTasksRequest(tenant=CAPABILITY, page_size=0),
            a2a_pb2.ListTasksRequest(tenant=CAPABILITY, page_size=101),
            a2a_pb2.ListTasksRequest(tenant=CAPABILITY, history_length=-1),
        ):
            assert refused(lambda bad=bad: stub.ListTasks(bad, metadata=token))[0] == "INVALID_ARGUMENT", bad
        config = a2a_pb2.TaskPushNotificationConfig(tenant=CAPABILITY, task_id=unknown_task)
        assert refused(lambda: stub.CreateTaskPushNotificationConfig(config, metadata=token))[0] == "INVALID_ARGUMENT"
        card = a2a_pb2.GetExtendedAgentCardRequest(tenant=CAPABILITY)
        assert refused(lambda: stub.GetExtendedAgentCard(card, metadata=token)) == (
            "FAILED_PRECONDITION",
            "UNSUPPORTED_OPERATION",
        )
