"""What a handler knows about the delivery it serves, and how it reaches the rest.

A handler that declares a parameter annotated :class:`Ctx` receives one: the
verified caller, the absolute deadline, the session and context ids, the trace
context, and calls to other capabilities through the router (carrying this
request's deadline, session, context and trace) and to the session context.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from . import tracing
from .contexts import ContextHandle, Contexts, blocking
from .errors import AgentReachError, HandlerError, RouterError, TransportError
from .logs import logger
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
    #: Work accepted with :meth:`Ctx.accept_and_report` and still running (a drain waits for it).
    background: set[asyncio.Task[None]] = field(default_factory=set)


class Accepted(Exception):
    """Raised by :meth:`Ctx.accept_and_report` on a task's delivery: the SDK answers ``202``."""


class Paused(Exception):
    """Raised by a preemptible handler when :attr:`Ctx.pause_requested` says to pause
    (DESIGN §9): the task becomes ``paused`` and its resumed delivery (on any
    instance) carries ``checkpoint`` as :attr:`Ctx.checkpoint`. Not an error the
    caller sees, and not remembered as the request's answer.

    >>> raise Paused({"pages_done": 12})  # doctest: +SKIP
    """

    def __init__(self, checkpoint: Any = None) -> None:
        super().__init__("paused for higher-priority work")
        self.checkpoint = checkpoint


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Ctx:
    """One delivery: who called, how long is left, and calls onwards. Cheap to create."""

    __slots__ = (
        "_links",
        "_pause",
        "_upstream",
        "_usage",
        "attempt",
        "budget",
        "capability",
        "capability_version",
        "chain",
        "checkpoint",
        "context_id",
        "deadline_ms",
        "history",
        "priority",
        "request_id",
        "session_id",
        "source",
        "task_id",
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
        task_id: str | None = None,
        assertion_token: str | None = None,
        chain: tuple[str, ...] = (),
        budget: dict[str, Any] | None = None,
        history: tuple[Turn, ...] = (),
        pause: asyncio.Event | None = None,
        checkpoint: Any = None,
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
        #: Set on a task's delivery (``POST /v1/tasks``): what :meth:`accept_and_report` reports under.
        self.task_id = task_id
        #: A multi-turn task's conversation before this message, oldest first: the
        #: caller's earlier messages and what this agent asked (empty for a first message).
        self.history = history
        self._links = links
        self._usage: dict[str, Any] | None = None
        self._pause = pause
        #: The checkpoint this delivery resumes from (what the handler raised
        #: :class:`Paused` with when its task was paused); None for a first delivery.
        self.checkpoint = checkpoint
        #: The delegation chain the router vouches for (DESIGN §9): the original subject
        #: first, each agent it passed through, the immediate caller last. Empty when the
        #: router sent no assertion (insecure development mode).
        self.chain: tuple[str, ...] = chain
        #: What is left of the chain's budget (``{"calls_left", "cost_left"}``, this call
        #: charged) when the call carries one; calls this handler makes spend from it.
        self.budget = budget
        # What calls onwards present upstream: the router's assertion for this call, and its id.
        self._upstream = (assertion_token, request_id) if assertion_token else None

    @property
    def pause_requested(self) -> bool:
        """Whether the router asked this delivery to pause (DESIGN §9): higher-priority
        work waits for this agent's room. A ``preemptible`` handler looks at it at its
        checkpoints and, when asked, raises :class:`Paused` with what it needs to resume.
        Always False for a handler not declared preemptible and for a call that is not
        a task's delivery."""
        return self._pause is not None and self._pause.is_set()

    @property
    def on_behalf_of(self) -> str | None:
        """On whose behalf this call is made: the chain's original subject (the caller itself
        for a direct call); None without an assertion."""
        return self.chain[0] if self.chain else None

    async def accept_and_report(self, work: Callable[[], Awaitable[T]]) -> T:
        """Long work (DESIGN §8, accepted now, result later): on a task's delivery, answers
        ``202 Accepted`` at once (the router releases the connection) and runs ``work()`` in
        the background, then reports its output (or its :class:`HandlerError`, or any other
        exception as ``HANDLER_PANICKED``) with ``POST /v1/tasks/{task_id}/result`` as this
        agent, retried until the deadline while the router is unreachable. A synchronous call
        has no task to report to: ``work()`` simply runs and its output is the answer, so one
        handler serves both. A drain waits for accepted work (``drain_timeout_s``).
        """
        links = self._links
        if self.task_id is None or links.router is None:
            return await work()
        url = f"{links.router.rstrip('/')}/v1/tasks/{quote(self.task_id, safe='')}/result"
        running = asyncio.get_running_loop().create_task(_report(links, url, work, self.deadline_ms))
        links.background.add(running)
        running.add_done_callback(links.background.discard)
        raise Accepted()

    def report_usage(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        model: str | None = None,
        cost: float | None = None,
    ) -> None:
        """Reports what serving this call cost (DESIGN §3.5 ``usage``): model tokens, the model,
        and ``cost`` in the abstract unit a delegation budget counts (default: the tokens'
        sum). Sent beside the output, it appears on the router's and this agent's
        ``invoke_agent`` spans (``gen_ai.usage.input_tokens``/``output_tokens``,
        ``gen_ai.request.model``) and in the router's ``agent_reach_model_tokens_total``.
        Several reports add up (the later model wins). Not sent with a streamed answer."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"report_usage: {name} must be a non-negative int, not {value!r}")
        spent = float(cost) if cost is not None else float((input_tokens or 0) + (output_tokens or 0))
        usage: dict[str, Any] = self._usage if self._usage is not None else {"cost": 0.0}
        usage["cost"] = usage["cost"] + spent
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if value is not None:
                usage[name] = usage.get(name, 0) + value
        if model is not None:
            usage["model"] = model
        self._usage = usage

    @property
    def usage(self) -> dict[str, Any] | None:
        """What :meth:`report_usage` reported so far (``{cost, input_tokens?, output_tokens?, model?}``)."""
        return dict(self._usage) if self._usage is not None else None

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
            if self._upstream is not None:
                # The router carries this call's delegation chain (and budget) on from it.
                headers["agent-reach-upstream"], headers["agent-reach-upstream-request"] = self._upstream
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


async def _report(links: Links, url: str, work: Callable[[], Awaitable[Any]], deadline_ms: int) -> None:
    """Runs accepted work and reports its outcome once, retrying while the router cannot be reached."""
    try:
        body: dict[str, Any] = {"output": _jsonable(await work())}
    except HandlerError as error:
        body = {"error": {"code": error.code, "message": error.message}}
    except AgentReachError as error:
        body = {"error": {"code": error.code, "message": error.message}}
    except Exception as error:  # noqa: BLE001 - reported, the agent keeps serving
        logger.exception("Accepted work raised.", extra={"url": url})
        body = {"error": {"code": "HANDLER_PANICKED", "message": f"the work raised {type(error).__name__}: {error}"}}
    headers = {"authorization": f"Bearer {links.token}"}
    pause = 0.1
    while True:
        try:
            response = await links.http.post(url, json=body, headers=headers, timeout=10.0)
        except httpx.HTTPError as error:
            if now_ms() + pause * 1000 >= deadline_ms:
                logger.error("Task result not reported before the deadline.", extra={"url": url, "error": str(error)})
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            continue
        if response.status_code >= 300:
            logger.error(
                "Task result refused.", extra={"url": url, "status": response.status_code, "body": response.text[:500]}
            )
        return
