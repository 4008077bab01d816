"""The inbound side: the agent contract over ASGI (DESIGN §3, §8).

``POST /invoke`` takes the router's forwarded envelope and answers ``200 {"output": ...}``
or ``{"error": {"code", "message", "details"?}}``; ``GET /healthz`` reports real
readiness; ``GET /metrics`` the agent's own numbers. Per delivery, in this order:
verify the router's assertion → decode the envelope → ``source``/``cap`` against the
assertion → ready? → deadline passed? → which handler → a repeat (dedup by
``request_id``)? → room (concurrency limit)? → validate the payload → run the handler
(until the deadline; an exception becomes an error answer, the agent keeps serving)
→ validate and encode the output.

``/invoke`` is served by a plain ASGI function rather than a Starlette endpoint: it is
the hot path and Starlette's request and response objects cost more than the work.
The other routes and the lifespan are a small Starlette app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import logs, tracing
from .assertion import Assertion, AssertionRefused, Verifier
from .ctx import Accepted, Ctx, Links, Paused, turns_of
from .dedup import Answer, Dedup
from .errors import AgentReachError, HandlerError
from .handlers import Handler, validation_details
from .logs import logger
from .metrics import Metrics
from .status import Status, StatusTracker
from .wire import Priority

#: The priorities an envelope may carry (absent: ``normal``).
_PRIORITIES = frozenset(priority.value for priority in Priority)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass
class AgentState:
    """Everything a delivery needs, shared by the server, the lifecycle and the ``Agent``."""

    agent_id: str
    handlers: list[Handler]
    links: Links
    verifier: Verifier | None
    max_concurrency: int
    max_body_bytes: int
    ttl_s: int
    status: StatusTracker
    dedup: Dedup = field(default_factory=Dedup)
    metrics: Metrics = field(default_factory=Metrics)
    #: Preemptible deliveries running now, by request id: what a pause request sets (DESIGN §9).
    pauses: dict[str, asyncio.Event] = field(default_factory=dict)
    inflight: int = 0
    #: The fewest deliveries in flight since the last heartbeat (what the next one reports).
    sustained_inflight: int = 0
    #: Set whenever the reported status may have changed (the lifecycle sends a heartbeat).
    status_changed: asyncio.Event = field(default_factory=asyncio.Event)
    deadlines: Deadlines = field(default_factory=lambda: Deadlines())
    #: Set while nothing is in flight (drain waits on it).
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    last_status: Status = Status.STARTING
    #: Whether OpenTelemetry was configured when the agent started (then deliveries are spans).
    spans: bool = False
    #: time.monotonic() of the last heartbeat the registry acknowledged (None: never).
    last_heartbeat: float | None = None
    _by_key: dict[tuple[str, str], Handler] = field(default_factory=dict)
    _by_capability: dict[str, Handler] = field(default_factory=dict)
    _thread_limiter: anyio.CapacityLimiter | None = None

    def __post_init__(self) -> None:
        self.idle.set()
        for handler in self.handlers:
            descriptor = handler.descriptor
            self._by_key[(descriptor.capability, descriptor.version)] = handler
            self._by_capability.setdefault(descriptor.capability, handler)

    def handler(self, capability: str, version: str) -> Handler | None:
        return self._by_key.get((capability, version)) or self._by_capability.get(capability)

    def take_sustained_inflight(self) -> int:
        """The in-flight count a heartbeat reports: the fewest in flight since the previous one.

        Not the count at the instant, which samples whichever short call happens to be
        running: routers would steer away from an idle agent for a whole heartbeat
        interval because of a call that ended a millisecond later (they count their own
        calls themselves, DESIGN §3.4). The minimum is the load that lasted the whole
        interval, which is what another router cannot see. Same as the Rust SDK.
        """
        sustained = min(self.sustained_inflight, self.inflight)
        self.sustained_inflight = self.inflight
        return sustained

    def current_status(self) -> Status:
        return self.status.current(self.inflight)

    def note_status(self) -> None:
        """Tells the lifecycle when the status to report changed."""
        status = self.status.current(self.inflight)
        if status is not self.last_status:
            self.last_status = status
            self.status_changed.set()

    def heartbeat_fresh(self) -> bool:
        return self.last_heartbeat is not None and time.monotonic() - self.last_heartbeat < self.ttl_s

    def thread_limiter(self) -> anyio.CapacityLimiter:
        # Sync handlers run in worker threads: as many as the agent takes deliveries.
        if self._thread_limiter is None:
            self._thread_limiter = anyio.CapacityLimiter(self.max_concurrency)
        return self._thread_limiter


def _error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> Answer:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return Answer(status, json.dumps({"error": error}).encode(), code)


#: What waiters on a delivery get if it ended without an answer (its task was cancelled).
_NO_ANSWER = _error(500, "HANDLER_PANICKED", "the delivery ended without an answer")


def _unauthenticated(refused: AssertionRefused) -> Answer:
    return _error(401, "UNAUTHENTICATED", refused.message, {"reason": refused.reason})


# === Pause requests (DESIGN §9) ===


async def serve_control(state: AgentState, authorization: str | None, body: bytes) -> Answer:
    """The router's pause request for a running delivery: ``{request_id, capability}``
    under its assertion for that capability, with ``x-agent-reach-control: pause``.
    ``202`` when the delivery runs here (its handler sees ``ctx.pause_requested``),
    ``404`` otherwise."""
    assertion: Assertion | None = None
    if state.verifier is not None:
        try:
            assertion = await state.verifier.verify(authorization)
        except AssertionRefused as refused:
            return _unauthenticated(refused)
    try:
        request = json.loads(body)
        request_id, capability = request["request_id"], request["capability"]
        if type(request_id) is not str or type(capability) is not str:
            raise TypeError("a field has the wrong type")
    except (ValueError, KeyError, TypeError) as error:
        return _error(400, "INVALID_ENVELOPE", f"a pause request is {{request_id, capability}}: {error}")
    if assertion is not None and assertion.capability != capability:
        return _unauthenticated(AssertionRefused("capability_mismatch", "the assertion is for another capability"))
    pause = state.pauses.get(request_id)
    if pause is None:
        return _error(404, "NOT_FOUND", "no preemptible delivery of that request id runs here")
    pause.set()
    logger.info("Pause requested.", extra={"request_id": request_id})
    return Answer(202, b'{"pause":"requested"}', "OK")


# === /invoke ===


async def serve_invoke(
    state: AgentState,
    authorization: str | None,
    traceparent: str | None,
    body: bytes,
    wants_events: bool = False,
) -> Answer | EventStream:
    """One delivery, from the raw request to the answer (an :class:`EventStream` for a
    streaming handler whose caller asked for ``text/event-stream``).

    Written as one function on purpose: it runs for every delivery, and in CPython each
    call layer and each small object shows in the agent's CPU per request (the bench).
    """
    assertion: Assertion | None = None
    if state.verifier is not None:
        try:
            assertion = await state.verifier.verify(authorization)
        except AssertionRefused as refused:
            logger.info("Delivery refused: %s", refused.message, extra={"reason": refused.reason})
            return _unauthenticated(refused)
    try:
        envelope = json.loads(body)
        request_id = envelope["request_id"]
        capability = envelope["capability"]
        version = envelope["capability_version"]
        deadline = envelope["deadline"]
        attempt = envelope.get("attempt", 1)
        payload = envelope.get("payload")
        session_id = envelope.get("session_id")
        context_id = envelope.get("context_id")
        source = envelope.get("source")
        priority = envelope.get("priority", "normal")
        task_id = envelope.get("task_id")
        checkpoint = envelope.get("checkpoint")
        budget = envelope.get("budget")
        if not (
            type(request_id) is str
            and type(capability) is str
            and type(version) is str
            and type(deadline) is int
            and type(attempt) is int
            and (session_id is None or type(session_id) is str)
            and (context_id is None or type(context_id) is str)
            and (source is None or type(source) is str)
            and (task_id is None or type(task_id) is str)
            and (budget is None or type(budget) is dict)
            and priority in _PRIORITIES
        ):
            raise TypeError("a field has the wrong type")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        return _error(400, "INVALID_ENVELOPE", f"cannot decode the forwarded envelope: {detail}")
    if assertion is not None:
        if source != assertion.caller:
            return _unauthenticated(
                AssertionRefused(
                    "source_mismatch",
                    f"the envelope's source {source!r} is not the caller the router vouched for ({assertion.caller!r})",
                )
            )
        if capability != assertion.capability:
            return _unauthenticated(
                AssertionRefused(
                    "capability_mismatch",
                    f"the envelope asks for `{capability}` but the assertion is for `{assertion.capability}`",
                )
            )
    status = state.status
    if status.phase is not Status.READY:
        if status.phase is Status.STARTING:
            return _error(503, "NOT_READY", "the agent is still initialising")
        return _error(503, "DRAINING", "the agent is shutting down")
    if time.time_ns() // 1_000_000 >= deadline:
        return _error(504, "DEADLINE_EXCEEDED", "the request's deadline passed before it arrived")
    handler = state.handler(capability, version)
    if handler is None:
        return _error(404, "CAPABILITY_NOT_FOUND", f"this agent does not serve `{capability}` {version}")
    if handler.item_adapter is not None and wants_events:
        # Not deduplicated: a stream cannot be replayed, and the router never retries one
        # it began relaying.
        if state.inflight >= state.max_concurrency:
            return _error(503, "OVERLOADED", "the agent is at its concurrency limit")
        try:
            value = handler.input_validator.validate_python(payload)
        except ValidationError as error:
            return _schema_mismatch(handler, error)
        ctx = Ctx(
            request_id=request_id,
            session_id=session_id,
            context_id=context_id,
            source=source,
            capability=capability,
            capability_version=version,
            deadline_ms=deadline,
            attempt=attempt,
            traceparent=traceparent,
            tenant=assertion.tenant if assertion is not None else None,
            links=state.links,
            assertion_token=assertion.token if assertion is not None else None,
            chain=assertion.chain if assertion is not None else (),
            budget=budget,
            history=turns_of(envelope.get("history")),
        )
        streamed = (value,) if handler.ctx_first is None else ((ctx, value) if handler.ctx_first else (value, ctx))
        return await EventStream.open(state, handler, streamed, deadline)
    # Keyed by caller too: one caller's request id never answers another's request.
    dedup_key = f"{source}\x00{request_id}" if source else request_id
    future, first = state.dedup.slot(dedup_key)
    if not first:
        return await asyncio.shield(future)
    # "Not now" answers are not kept: a later delivery may find room.
    if state.inflight >= state.max_concurrency:
        state.dedup.forget(dedup_key)
        future.cancel()
        return _error(503, "OVERLOADED", "the agent is at its concurrency limit")

    started = time.perf_counter()
    state.inflight += 1
    if state.inflight == 1:
        state.idle.clear()
    if state.inflight >= status.busy_at or state.last_status is not Status.READY:
        state.note_status()
    answer = _NO_ANSWER
    fields = logs.bind(traceparent, request_id, session_id)
    # A preemptible handler's task delivery may be asked to pause (DESIGN §9).
    pause: asyncio.Event | None = None
    if handler.descriptor.preemptible and task_id is not None:
        pause = state.pauses[request_id] = asyncio.Event()
    try:
        try:
            value = handler.input_validator.validate_python(payload)
        except ValidationError as error:
            answer = _schema_mismatch(handler, error)
        else:
            reporter: Ctx | None = None
            if handler.ctx_first is None:
                arguments: tuple[Any, ...] = (value,)
            else:
                reporter = Ctx(
                    request_id=request_id,
                    session_id=session_id,
                    context_id=context_id,
                    source=source,
                    capability=capability,
                    capability_version=version,
                    deadline_ms=deadline,
                    attempt=attempt,
                    priority=Priority(priority),
                    task_id=task_id,
                    pause=pause,
                    checkpoint=checkpoint,
                    traceparent=traceparent,
                    tenant=assertion.tenant if assertion is not None else None,
                    links=state.links,
                    assertion_token=assertion.token if assertion is not None else None,
                    chain=assertion.chain if assertion is not None else (),
                    budget=budget,
                    history=turns_of(envelope.get("history")),
                )
                arguments = (reporter, value) if handler.ctx_first else (value, reporter)
            if state.spans:
                with tracing.server_span(
                    traceparent, capability, state.agent_id, session_id, {"request_id": request_id}
                ) as span:
                    answer = await _run(state, handler, arguments, deadline, reporter)
                    tracing.record_usage(span, reporter.usage if reporter is not None else None)
            else:
                answer = await _run(state, handler, arguments, deadline, reporter)
    finally:
        if pause is not None:
            state.pauses.pop(request_id, None)
        logs.unbind(fields)
        state.inflight -= 1
        state.sustained_inflight = min(state.sustained_inflight, state.inflight)
        if state.inflight == 0:
            state.idle.set()
        if state.inflight + 1 >= status.busy_at or state.last_status is not Status.READY:
            state.note_status()
        future.set_result(answer)
        if answer is _NO_ANSWER or answer.code == "PAUSED":
            # Cancelled from outside (e.g. the server stopping): waiting repeats get the 500,
            # but a later delivery of the same request runs again rather than inheriting it.
            # Paused: the resumed delivery (same request id) runs the handler again.
            state.dedup.forget(dedup_key)
        state.metrics.observe(capability, answer, time.perf_counter() - started)
    return answer


def _schema_mismatch(handler: Handler, error: ValidationError) -> Answer:
    problems = validation_details(error)
    first = (problems[0]["pointer"] or "/") if problems else "/"
    return _error(
        422,
        "SCHEMA_MISMATCH",
        f"payload does not match the input of `{handler.descriptor.capability}` "
        f"({len(problems)} problem(s), first at `{first}`)",
        {"errors": problems, "total": len(problems)},
    )


class Deadlines:
    """Cancels deliveries still running at their deadline.

    One check every ``GRANULARITY_S`` while any delivery runs, instead of a timer per
    delivery: a timer costs a heap push and a cancel on every delivery's path (the bench
    shows it), the check a dictionary entry. A handler is cancelled at most 10 ms after
    its deadline; the router, which keeps its own timer, has answered the caller by then.
    """

    GRANULARITY_S = 0.01

    def __init__(self) -> None:
        self._running: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._check: asyncio.TimerHandle | None = None

    def watch(self, task: asyncio.Task[Any], deadline_ms: int) -> None:
        loop = task.get_loop()
        self._running[task] = loop.time() + (deadline_ms - time.time_ns() // 1_000_000) / 1000
        if self._check is None:
            self._check = loop.call_later(self.GRANULARITY_S, self._expire, loop)

    def done(self, task: asyncio.Task[Any]) -> bool:
        """Stops watching ``task``; True when its deadline cancelled it (the cancel is then undone)."""
        del self._running[task]
        if task in self._expired:
            self._expired.discard(task)
            return task.uncancel() == 0
        return False

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for task, when in self._running.items():
            if when <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._check = loop.call_later(self.GRANULARITY_S, self._expire, loop) if self._running else None


async def _run(
    state: AgentState, handler: Handler, arguments: tuple[Any, ...], deadline_ms: int, ctx: Ctx | None
) -> Answer:
    """Runs the handler until the deadline and turns what happened into the answer (with the
    usage it reported through ``ctx``, DESIGN §3.5, beside the output)."""
    task = asyncio.current_task()
    assert task is not None, "deliveries run in a task"
    deadlines = state.deadlines
    deadlines.watch(task, deadline_ms)
    try:
        if handler.item_adapter is not None:
            # A streaming handler for a caller that did not ask for events: its items as a list.
            output = [item async for item in handler.function(*arguments)]
        elif handler.is_async:
            output = await handler.function(*arguments)
        else:
            # A thread cannot be stopped: past the deadline its answer is dropped.
            output = await anyio.to_thread.run_sync(
                lambda: handler.function(*arguments), abandon_on_cancel=True, limiter=state.thread_limiter()
            )
    except asyncio.CancelledError:
        if deadlines.done(task):
            return _error(504, "DEADLINE_EXCEEDED", "the handler did not finish before the deadline")
        raise
    except Accepted:
        deadlines.done(task)
        # Remembered like any answer: a redelivery of this task finds it accepted, not started twice.
        return Answer(202, b'{"accepted":true}', "ACCEPTED")
    except Paused as paused:
        deadlines.done(task)
        body = json.dumps({"paused": {"checkpoint": paused.checkpoint}}).encode()
        return Answer(200, body, "PAUSED")
    except HandlerError as error:
        deadlines.done(task)
        return _error(error.status, error.code, error.message)
    except AgentReachError as error:
        deadlines.done(task)
        # A failed call onwards: the caller learns the code at its origin.
        return _error(503 if error.retryable else 502, error.code, error.message)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - isolation: the agent keeps serving
        deadlines.done(task)
        logger.exception("Handler raised; the agent keeps serving.", extra={"handler": handler.name})
        return _error(500, "HANDLER_PANICKED", f"the handler raised {type(error).__name__}: {error}")
    # Finished: a deadline that fired just as it returned leaves a whole, late answer, kept.
    deadlines.done(task)
    try:
        encoded = handler.serializer.to_json(handler.output_validator.validate_python(output))
    except (ValidationError, ValueError, TypeError) as error:
        logger.error("Handler output does not match its type.", extra={"handler": handler.name, "error": str(error)})
        return _error(500, "INVALID_OUTPUT", f"the handler's output does not match its declared type: {error}")
    usage = ctx.usage if ctx is not None else None
    if usage:
        return Answer(200, b'{"output":' + encoded + b',"usage":' + json.dumps(usage).encode() + b"}", "OK")
    return Answer(200, b'{"output":' + encoded + b"}", "OK")


# === Streaming handlers ===


def _event(data: bytes) -> bytes:
    # Encoded JSON has no raw newline, so one `data:` line carries it.
    return b"data: " + data + b"\n\n"


def _error_event(code: str, message: str) -> bytes:
    return b"event: error\ndata: " + json.dumps({"code": code, "message": message}).encode() + b"\n\n"


class EventStream:
    """A streaming handler's answer (DESIGN §8, "Streaming"): each item one ``data:``
    event as it is yielded; an error after the first item, or the deadline, ends it with
    ``event: error`` ``{code, message}``. The first item is awaited before the answer's
    head, so a handler that fails at once answers an ordinary error with its status.
    The caller going away (``http.disconnect``) cancels the handler: the generator is
    closed, so its ``finally`` blocks run."""

    def __init__(self, state: AgentState, handler: Handler, items: Any, first: bytes, deadline_ms: int) -> None:
        self.state = state
        self.handler = handler
        self.items = items
        self.first = first
        self.deadline_ms = deadline_ms
        self.started = time.perf_counter()

    @classmethod
    async def open(
        cls, state: AgentState, handler: Handler, arguments: tuple[Any, ...], deadline_ms: int
    ) -> Answer | EventStream:
        """Starts the handler and waits for its first item (its place in flight is taken
        here and given back when the stream ends)."""
        state.inflight += 1
        if state.inflight == 1:
            state.idle.clear()
        items = handler.function(*arguments)
        first = await cls._next(handler, items, deadline_ms)
        if isinstance(first, Answer) or first is None:
            await items.aclose()
            cls._release(state)
            if first is None:
                return Answer(200, b'{"output":[]}', "OK")
            state.metrics.observe(handler.descriptor.capability, first, 0.0)
            return first
        return cls(state, handler, items, first, deadline_ms)

    @staticmethod
    def _release(state: AgentState) -> None:
        state.inflight -= 1
        if state.inflight == 0:
            state.idle.set()

    @staticmethod
    async def _next(handler: Handler, items: Any, deadline_ms: int) -> bytes | Answer | None:
        """The next item encoded, an error answer, or None at the end."""
        remaining = (deadline_ms - time.time_ns() // 1_000_000) / 1000
        try:
            item = await asyncio.wait_for(anext(items), timeout=max(remaining, 0.0))
        except StopAsyncIteration:
            return None
        except TimeoutError:
            return _error(504, "DEADLINE_EXCEEDED", "the handler did not finish before the deadline")
        except HandlerError as error:
            return _error(error.status, error.code, error.message)
        except AgentReachError as error:
            return _error(503 if error.retryable else 502, error.code, error.message)
        except Exception as error:  # noqa: BLE001 - isolation: the agent keeps serving
            logger.exception("Streaming handler raised; the agent keeps serving.", extra={"handler": handler.name})
            return _error(500, "HANDLER_PANICKED", f"the handler raised {type(error).__name__}: {error}")
        assert handler.item_adapter is not None, "streams are opened for streaming handlers only"
        try:
            return bytes(handler.item_adapter.serializer.to_json(handler.item_adapter.validator.validate_python(item)))
        except (ValidationError, ValueError, TypeError) as error:
            return _error(500, "INVALID_OUTPUT", f"the handler's item does not match its declared type: {error}")

    async def _pump(self, send: Send) -> Answer:
        await send({"type": "http.response.body", "body": _event(self.first), "more_body": True})
        while True:
            pulled = await self._next(self.handler, self.items, self.deadline_ms)
            if pulled is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return Answer(200, b"", "OK")
            if isinstance(pulled, Answer):
                error = json.loads(pulled.body)["error"]
                last = _error_event(error["code"], error["message"])
                await send({"type": "http.response.body", "body": last, "more_body": False})
                return pulled
            await send({"type": "http.response.body", "body": _event(pulled), "more_body": True})

    async def send(self, send: Send, receive: Receive) -> None:
        """Writes the stream until it ends or the caller disconnects."""
        answer = _NO_ANSWER
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                }
            )
            pump = asyncio.ensure_future(self._pump(send))
            gone = asyncio.ensure_future(_disconnected(receive))
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            gone.cancel()
            if pump.done():
                answer = pump.result()
            else:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                answer = _error(499, "CANCELED", "the caller went away")
        finally:
            await self.items.aclose()
            self._release(self.state)
            self.state.metrics.observe(self.handler.descriptor.capability, answer, time.perf_counter() - self.started)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# === ASGI ===


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None when it exceeds ``limit`` bytes."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body if len(body) <= limit else None
    chunks = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _send(send: Send, answer: Answer) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": answer.status,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(answer.body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer.body})


class AgentApp:
    """The agent's ASGI application: mount it into FastAPI/Starlette or serve it as is.

    ``lifespan`` starts and stops the agent (registration, heartbeats, drain) when
    the host server runs this app's lifespan; a host app with its own lifespan calls
    ``agent.lifespan`` from it instead (see ``Agent.lifespan``).
    """

    def __init__(self, state_of: Callable[[], AgentState | None], other: Starlette) -> None:
        self._state_of = state_of
        self._other = other

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and _route_path(scope) == "/invoke":
            state = self._state_of()
            if state is None:
                await _send(send, _error(503, "NOT_READY", "the agent has not started"))
                return
            authorization = traceparent = None
            wants_events = control = False
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                elif name == b"traceparent":
                    traceparent = value.decode("latin-1")
                elif name == b"accept":
                    wants_events = b"text/event-stream" in value.lower()
                elif name == b"x-agent-reach-control":
                    control = value == b"pause"
            body = await _read_body(receive, state.max_body_bytes)
            if body is not None and control:
                await _send(send, await serve_control(state, authorization, body))
                return
            if body is None:
                answer: Answer | EventStream = _error(
                    413, "PAYLOAD_TOO_LARGE", f"the envelope exceeds {state.max_body_bytes} bytes"
                )
            else:
                answer = await serve_invoke(state, authorization, traceparent, body, wants_events)
            if isinstance(answer, EventStream):
                await answer.send(send, receive)
            else:
                await _send(send, answer)
            return
        await self._other(scope, receive, send)


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :]
    return path


def other_routes(state_of: Callable[[], AgentState | None], lifespan: Any) -> Starlette:
    """``/healthz``, ``/metrics`` and the lifespan, as a Starlette app."""

    async def healthz(request: Request) -> Response:
        state = state_of()
        if state is None:
            return JSONResponse({"status": "stopped", "healthy": False}, status_code=503)
        status = state.current_status()
        age = None if state.last_heartbeat is None else int((time.monotonic() - state.last_heartbeat) * 1000)
        healthy = (
            status in (Status.READY, Status.BUSY) and state.heartbeat_fresh() and state.inflight < state.max_concurrency
        )
        body = {
            "status": str(status),
            "inflight": state.inflight,
            "max_concurrency": state.max_concurrency,
            "last_heartbeat_ms_ago": age,
            "healthy": healthy,
        }
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def metrics(request: Request) -> Response:
        state = state_of()
        if state is None:
            return PlainTextResponse("", status_code=503)
        text = state.metrics.render(state.inflight, str(state.current_status()))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def not_found(request: Request) -> Response:
        return JSONResponse(
            {"error": {"code": "NOT_FOUND", "message": "agent routes: POST /invoke, GET /healthz, GET /metrics"}},
            status_code=404,
        )

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ],
        lifespan=lifespan,
    )
