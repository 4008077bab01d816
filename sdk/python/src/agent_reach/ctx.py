"""What a handler knows about the delivery it serves, and how it reaches the rest.

A handler that declares a parameter annotated :class:`Ctx` receives one: the
verified caller, the absolute deadline, the session and context ids, the trace
context, and calls to other capabilities through the router (carrying this
request's deadline, session, context and trace) and to the session context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import httpx
from pydantic import TypeAdapter

from . import tracing
from .contexts import ContextHandle, Contexts, blocking
from .errors import RouterError, TransportError
from .wire import InvokeResult, Policy, Priority, invoke_body, invoke_result, unreachable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Turn:
    """One earlier turn of a multi-turn task's conversation (docs/design.md,
    "Multi-turn tasks"), as the router delivers it with the next message: a message of
    the caller (``role == "user"``, its ``payload``) or a time this agent asked for more
    input (``role == "agent"``, its ``message``; see :class:`InputRequired`)."""

    role: Literal["user", "agent"]
    payload: Any = None
    message: str | None = None


def turns_of(history: Any) -> tuple[Turn, ...]:
    """The envelope's ``history`` as turns; one this SDK cannot read is left out."""
    if not isinstance(history, list):
        return ()
    turns = []
    for turn in history:
        if not isinstance(turn, dict):
            return ()
        role = turn.get("role")
        if role == "user":
            turns.append(Turn("user", payload=turn.get("payload")))
        elif role == "agent" and isinstance(turn.get("message"), str):
            turns.append(Turn("agent", message=turn["message"]))
        else:
            return ()
    return tuple(turns)


@dataclass
class Links:
    """Clients shared by every request of one agent."""

    http: httpx.AsyncClient
    router: str | None
    contexts: Contexts | None
    token: str


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Ctx:
    """One delivery: who called, how long is left, and calls onwards. Cheap to create."""

    __slots__ = (
        "_links",
        "attempt",
        "capability",
        "capability_version",
        "context_id",
        "deadline_ms",
        "history",
        "priority",
        "request_id",
        "session_id",
        "source",
        "tenant",
        "traceparent",
    )

    def __init__(
        self,
        *,
        request_id: str,
        session_id: str | None,
        context_id: str | None,
        source: str | None,
        capability: str,
        capability_version: str,
        deadline_ms: int,
        attempt: int,
        traceparent: str | None,
        tenant: str | None,
        links: Links,
        priority: Priority = Priority.NORMAL,
        history: tuple[Turn, ...] = (),
    ) -> None:
        #: The idempotency key of this request.
        self.request_id = request_id
        self.session_id = session_id
        self.context_id = context_id
        #: The verified caller (the router's assertion ``sub``).
        self.source = source
        self.capability = capability
        self.capability_version = capability_version
        #: Absolute deadline, epoch milliseconds.
        self.deadline_ms = deadline_ms
        #: 1 for the first delivery, 2 for the first retry, ...
        self.attempt = attempt
        #: How urgent the caller said this request is; calls onwards carry it unless given.
        self.priority = priority
        self.traceparent = traceparent
        #: The tenant the router's assertion names (None when unverified).
        self.tenant = tenant
        #: A multi-turn task's conversation before this message, oldest first: the
        #: caller's earlier messages and what this agent asked (empty for a first message).
        self.history = history
        self._links = links

    @property
    def trace_id(self) -> str | None:
        """The W3C trace id of this request, if the router sent a ``traceparent``."""
        return tracing.trace_id_of(self.traceparent)

    @property
    def remaining_s(self) -> float:
        """Seconds left before the deadline (0 once it passed)."""
        return max(0.0, (self.deadline_ms - now_ms()) / 1000)

    @property
    def context(self) -> ContextHandle:
        """The session context this request names (``context_id``)."""
        return ContextHandle(self._links.contexts, self.context_id)

    @overload
    async def call(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = ...,
        policy: Policy | str | None = ...,
        timeout_ms: int | None = ...,
        priority: Priority | str | None = ...,
        output: None = ...,
    ) -> Any: ...

    @overload
    async def call(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = ...,
        policy: Policy | str | None = ...,
        timeout_ms: int | None = ...,
        priority: Priority | str | None = ...,
        output: type[T],
    ) -> T: ...

    async def call(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = None,
        policy: Policy | str | None = None,
        timeout_ms: int | None = None,
        priority: Priority | str | None = None,
        output: type[Any] | None = None,
    ) -> Any:
        """Calls ``capability`` through the router and returns its output.

        ``version`` is a semver requirement (``"^1.2"``); ``policy`` the selection
        policy; ``priority`` how urgent (this request's own unless given); ``timeout_ms``
        shortens the time allowed (never past this request's own deadline); ``output`` validates
        and converts the answer (a pydantic model or any type). A failure raises the
        router's typed error; left uncaught in a handler it becomes the handler's error
        with the same code, so a chain reports a failure at its origin.
        """
        result = await self.call_envelope(
            capability, payload, version=version, policy=policy, timeout_ms=timeout_ms, priority=priority
        )
        return _converted(capability, result.output, output)

    async def call_envelope(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = None,
        policy: Policy | str | None = None,
        timeout_ms: int | None = None,
        priority: Priority | str | None = None,
    ) -> InvokeResult:
        """Like :meth:`call`, returning the whole result envelope (agent, attempts, latency)."""
        links = self._links
        if links.router is None:
            raise TransportError("NO_ROUTER", "this agent was built without a router URL (Agent(router=...))")
        deadline = self.deadline_ms
        if timeout_ms is not None:
            deadline = min(deadline, now_ms() + timeout_ms)
        body = invoke_body(
            capability,
            _jsonable(payload),
            version=version,
            policy=policy,
            deadline_ms=deadline,
            session_id=self.session_id,
            context_id=self.context_id,
            priority=priority if priority is not None else self.priority,
        )
        # The router answers by the deadline; a little slack lets its DEADLINE_EXCEEDED arrive.
        timeout = max(0.0, (deadline - now_ms()) / 1000) + 2.0
        with tracing.client_span("agent.call", {"capability": capability}):
            headers = {
                "authorization": f"Bearer {links.token}",
                "traceparent": tracing.child_traceparent(self.traceparent),
            }
            url = f"{links.router.rstrip('/')}/v1/invoke"
            try:
                response = await links.http.post(url, json=body, headers=headers, timeout=timeout)
            except httpx.HTTPError as error:
                raise unreachable("router", links.router, error) from error
            return invoke_result(response)

    def call_sync(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = None,
        policy: Policy | str | None = None,
        timeout_ms: int | None = None,
        priority: Priority | str | None = None,
        output: type[Any] | None = None,
    ) -> Any:
        """:meth:`call` for sync handlers: blocks the handler's worker thread until the answer."""

        async def run() -> Any:
            result = await self.call_envelope(
                capability, payload, version=version, policy=policy, timeout_ms=timeout_ms, priority=priority
            )
            return _converted(capability, result.output, output)

        return blocking(run)


def _converted(capability: str, value: Any, output: type[Any] | None) -> Any:
    """``value`` validated as ``output`` (as is without one)."""
    if output is None:
        return value
    try:
        return TypeAdapter(output).validate_python(value)
    except ValueError as error:
        shape = f"`{capability}` answered a shape that is not {output!r}: {error}"
        raise RouterError("OUTPUT_MISMATCH", shape) from error


def _jsonable(payload: Any) -> Any:
    """Pydantic models and dataclasses become JSON-ready values; anything else is sent as is."""
    if isinstance(payload, (dict, list, str, int, float, bool)) or payload is None:
        return payload
    return TypeAdapter(type(payload)).dump_python(payload, mode="json")
