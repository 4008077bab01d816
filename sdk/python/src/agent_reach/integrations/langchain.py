"""LangChain and LangGraph: capabilities as tools, and a graph as a capability's handler.

:func:`capability_tools` asks the router which capabilities the caller may call (the MCP
door's ``tools/list``, filtered by ``acl.yaml``, each with its input schema and
description) and makes each a LangChain ``StructuredTool`` that a LangGraph ``ToolNode`` (or
any LangChain agent) can run. A tool is named after its capability with ``-`` for ``.``
(``order.query`` → ``order-query``: model providers allow only ``[a-zA-Z0-9_-]`` in tool
names, and capability names hold no ``-``, so names never collide). A capability whose
input is not an object takes its payload as the argument ``input`` (as over MCP). Running
inside a :func:`graph_handler` delivery, a tool calls through that delivery's
:class:`~agent_reach.Ctx` (its deadline, session, context, priority and trace); elsewhere
through the caller it was made with. A failed call is a ``ToolException`` whose message is
``CODE: message``, which LangGraph's ``ToolNode`` hands back to the model.

:func:`graph_handler` turns a compiled LangGraph graph into a handler: the payload becomes
the graph's input state, the final state becomes the output, and the delivery's ``Ctx`` is
in the run's config (:func:`ctx_of`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, TypeAdapter

try:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "agent_reach.integrations.langchain needs langchain-core: pip install 'agent-reach[langchain]'"
    ) from error

from ..client import AsyncClient, Client
from ..ctx import Ctx
from ..errors import AgentReachError, RouterError
from ..wire import unreachable

#: Where a :func:`graph_handler` delivery puts its ``Ctx`` in the run's ``configurable``.
CTX_KEY = "agent_reach_ctx"

Caller = Ctx | AsyncClient | Client


def tool_name(capability: str) -> str:
    """The tool name of ``capability``: ``.`` becomes ``-`` (``order.query`` → ``order-query``)."""
    return capability.replace(".", "-")


def ctx_of(config: RunnableConfig | None) -> Ctx | None:
    """The delivery a :func:`graph_handler` run serves, from a node's or tool's ``config``."""
    configurable = (config or {}).get("configurable") or {}
    found = configurable.get(CTX_KEY)
    return found if isinstance(found, Ctx) else None


async def capability_tools(caller: Caller, *, only: Iterable[str] | None = None) -> list[StructuredTool]:
    """Every capability ``caller`` may call (or those of them named in ``only``) as a tool.

    ``caller`` is a handler's ``Ctx`` (calls carry its deadline, session and trace), an
    :class:`~agent_reach.AsyncClient` or a :class:`~agent_reach.Client`; the list is the
    router's for its token, at each capability's highest version.
    """
    listed = await _list_tools(caller)
    wanted = set(only) if only is not None else None
    if wanted is not None:
        missing = wanted - {str(tool["name"]) for tool in listed}
        if missing:
            raise RouterError(
                "CAPABILITY_NOT_FOUND",
                f"not callable by this caller (or not registered): {', '.join(sorted(missing))}",
            )
    return [_tool(caller, spec) for spec in listed if wanted is None or spec["name"] in wanted]


def capability_tools_sync(client: Client, *, only: Iterable[str] | None = None) -> list[StructuredTool]:
    """:func:`capability_tools` for a synchronous program (outside an event loop)."""
    return asyncio.run(capability_tools(client, only=only))


def _links(caller: Caller) -> tuple[str, str]:
    """(router URL, bearer token) of ``caller``."""
    if isinstance(caller, Ctx):
        router, token = caller._links.router, caller._links.token
    else:
        router, token = caller.router, caller._token
    if router is None:
        raise RouterError("NO_ROUTER", "capability tools need a router (Agent(router=...) or Client(router=...))")
    return router.rstrip("/"), token


async def _list_tools(caller: Caller) -> list[dict[str, Any]]:
    router, token = _links(caller)
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"}
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(f"{router}/mcp", json=request, headers=headers)
    except httpx.HTTPError as error:
        raise unreachable("router", router, error) from error
    answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if response.status_code != 200 or "result" not in answer:
        refusal = answer.get("error") or {}
        data = refusal.get("data") or {}
        raise RouterError(
            str(data.get("code") or "UNEXPECTED_ANSWER"),
            f"the router's tools/list answered {response.status_code}: {refusal.get('message') or response.text[:200]}",
        )
    return list(answer["result"]["tools"])


def _is_wrapped(schema: dict[str, Any]) -> bool:
    """Whether the router offered a non-object input wrapped as ``{"input": …}`` (exactly its wrapper's shape)."""
    return (
        set(schema) <= {"type", "properties", "required", "$schema", "$defs", "definitions"}
        and set(schema.get("properties") or {}) == {"input"}
        and schema.get("required") == ["input"]
    )


class _Invoke(Protocol):
    def __call__(self, capability: str, payload: Any) -> Awaitable[Any]: ...


def _tool(caller: Caller, spec: dict[str, Any]) -> StructuredTool:
    capability = str(spec["name"])
    schema: dict[str, Any] = spec.get("inputSchema") or {"type": "object"}
    wrapped = _is_wrapped(schema)

    def payload_of(arguments: dict[str, Any]) -> Any:
        return arguments.get("input") if wrapped else arguments

    def failed(error: AgentReachError) -> ToolException:
        return ToolException(f"{error.code}: {error.message}")

    async def call(config: RunnableConfig, **arguments: Any) -> Any:
        via: _Invoke = _invoker(ctx_of(config) or caller)
        try:
            return await via(capability, payload_of(arguments))
        except AgentReachError as error:
            raise failed(error) from error

    def call_sync(config: RunnableConfig, **arguments: Any) -> Any:
        if not isinstance(caller, Client):
            raise ToolException(f"`{tool_name(capability)}` is asynchronous: run it with ainvoke")
        try:
            return caller.invoke(capability, payload_of(arguments)).output
        except AgentReachError as error:
            raise failed(error) from error

    return StructuredTool(
        name=tool_name(capability),
        description=str(spec.get("description") or f"Calls the Agent-Reach capability {capability}."),
        args_schema=schema,
        coroutine=call,
        func=call_sync,
        handle_tool_error=True,
        metadata={"capability": capability},
    )


def _invoker(caller: Caller) -> _Invoke:
    if isinstance(caller, Ctx):
        return caller.call
    if isinstance(caller, AsyncClient):

        async def invoke(capability: str, payload: Any) -> Any:
            return (await caller.invoke(capability, payload)).output

        return invoke
    client = caller

    async def invoke_sync(capability: str, payload: Any) -> Any:
        return await asyncio.to_thread(lambda: client.invoke(capability, payload).output)

    return invoke_sync


class _Graph(Protocol):
    """What :func:`graph_handler` needs of a compiled LangGraph graph."""

    async def ainvoke(self, state: Any, /, config: RunnableConfig | None = None, **kwargs: Any) -> Any: ...


def graph_handler(
    graph: _Graph,
    *,
    input: type[Any],  # noqa: A002 - the capability's input, as in @agent.handler's annotations
    output: type[Any],
    state: Callable[[Any], Any] | None = None,
    result: Callable[[Any], Any] | None = None,
) -> Callable[..., Awaitable[Any]]:
    """A handler (for ``@agent.handler(...)``, called as ``agent.handler("x")(graph_handler(...))``)
    running ``graph`` once per delivery.

    ``input`` and ``output`` are the capability's types (its registered schemas, as any
    handler's annotations). The payload becomes the graph's input state (``state(payload)``,
    else the payload as a dict); the final state becomes the output (``result(final)``, else
    the final state validated as ``output``, extra keys ignored). Nodes and tools reach the
    delivery's ``Ctx`` with :func:`ctx_of` on their ``config``; the tools of
    :func:`capability_tools` use it by themselves.
    """
    as_state = state or _state_of
    adapter: TypeAdapter[Any] = TypeAdapter(output)

    async def run(payload: Any, ctx: Ctx) -> Any:
        config: RunnableConfig = {"configurable": {CTX_KEY: ctx}}
        final = await graph.ainvoke(as_state(payload), config=config)
        return result(final) if result is not None else adapter.validate_python(final)

    run.__annotations__ = {"payload": input, "ctx": Ctx, "return": output}
    run.__name__ = run.__qualname__ = f"graph_handler({type(graph).__name__})"
    return run


def _state_of(payload: Any) -> Any:
    if isinstance(payload, BaseModel):
        return payload.model_dump(mode="python")
    return payload
