"""Calling capabilities from programs that are not agents.

:class:`AsyncClient` (asyncio) and :class:`Client` (blocking) speak the router's caller
API: ``POST /v1/invoke`` (the synchronous path), durable tasks (``POST /v1/tasks``,
status, cancel, results by session) with signed callbacks, and the context service.
Failures raise the typed errors of :mod:`agent_reach.errors`::

    async with AsyncClient(router="http://router:7500", token=token) as client:
        result = await client.invoke("order.query", {"order_id": "SO-2024001"}, version="^1.2")
        print(result.output, result.agent_id, result.attempts)

``https://`` routers and context services are verified against the system's roots, or only
against the CAs of ``ca_file=`` (or ``$AGENT_REACH_CA_FILE``), as a private CA needs.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from . import tracing, trust
from .contexts import Contexts
from .errors import ConfigError, TransportError
from .wire import (
    ContextView,
    InvokeResult,
    Policy,
    Priority,
    context_view,
    envelope_error,
    invoke_body,
    invoke_result,
    patch_body,
    router_answer,
    service_answer,
    unreachable,
)

TERMINAL = ("succeeded", "failed", "canceled")


@dataclass(frozen=True)
class TaskAccepted:
    """The answer to a task submission: stored (``202``), or an existing task for a repeated ``request_id``."""

    task_id: str
    status: str
    duplicate: bool


@dataclass(frozen=True)
class TaskView:
    """A task as the router reports it; ``result`` is its result envelope once it ended."""

    task_id: str
    status: str
    attempts: int
    request_id: str
    session_id: str | None
    capability: str
    result: dict[str, Any] | None
    transitions: list[dict[str, Any]] = field(repr=False)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def output(self) -> Any:
        """The task's output; a failed task raises its typed error."""
        if self.result is None:
            raise TransportError("TASK_NOT_DONE", f"task `{self.task_id}` is `{self.status}`, without a result yet")
        if self.result.get("status") != "succeeded":
            raise envelope_error(self.result, None)
        return self.result.get("output")


@dataclass(frozen=True)
class SessionResult:
    cursor: str
    task_id: str
    status: str
    result: dict[str, Any] | None


@dataclass(frozen=True)
class SessionResults:
    """One page of a session's results; pass ``next_after`` as ``after`` for the next."""

    session_id: str
    results: list[SessionResult]
    next_after: str | None


def _task_view(body: dict[str, Any]) -> TaskView:
    result = body.get("result")
    return TaskView(
        task_id=str(body.get("task_id", "")),
        status=str(body.get("status", "")),
        attempts=int(body.get("attempts", 0)),
        request_id=str(body.get("request_id", "")),
        session_id=body.get("session_id") if isinstance(body.get("session_id"), str) else None,
        capability=str(body.get("capability", "")),
        result=result if isinstance(result, dict) else None,
        transitions=list(body.get("transitions") or []),
    )


def _session_results(body: dict[str, Any]) -> SessionResults:
    results = [
        SessionResult(
            cursor=str(entry.get("cursor", "")),
            task_id=str(entry.get("task_id", "")),
            status=str(entry.get("status", "")),
            result=entry.get("result") if isinstance(entry.get("result"), dict) else None,
        )
        for entry in body.get("results") or []
        if isinstance(entry, dict)
    ]
    after = body.get("next_after")
    return SessionResults(str(body.get("session_id", "")), results, after if isinstance(after, str) else None)


def _task_body(
    capability: str,
    payload: Any,
    callback_url: str | None,
    callback_secret_ref: str | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    body = invoke_body(capability, payload, **options)
    if callback_url is not None:
        callback: dict[str, Any] = {"url": callback_url}
        if callback_secret_ref is not None:
            callback["secret_ref"] = callback_secret_ref
        body["callback"] = callback
    return body


def _accepted(body: dict[str, Any]) -> TaskAccepted:
    return TaskAccepted(str(body.get("task_id", "")), str(body.get("status", "")), bool(body.get("duplicate", False)))


def _results_params(after: str | None, limit: int | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if after is not None:
        params["after"] = after
    if limit is not None:
        params["limit"] = str(limit)
    return params


class _Base:
    def __init__(
        self,
        router: str | None,
        token: str | None,
        context: str | None,
        timeout_s: float,
        ca_file: trust.PathLike | None = None,
        own_http: bool = True,
    ) -> None:
        problems = []
        if ca_file is not None and not own_http:
            problems.append("pass ca_file= or http= (a client built with its own verify=), not both")
        elif own_http:
            problems += trust.problems(trust.ca_file_from(ca_file))
        if not router and not context:
            problems.append("give router= (capabilities, tasks) and/or context= (the context service)")
        if not token:
            problems.append("no token: pass token= (a JWT whose sub is the caller's name)")
        if problems:
            raise ConfigError(problems)
        self.router = router.rstrip("/") if router else None
        self.context_url = context.rstrip("/") if context else None
        self._token = token or ""
        self._auth = {"authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s
        #: httpx's ``verify=`` for the client this one builds (verification always on).
        self._verify = trust.verify(trust.ca_file_from(ca_file)) if own_http else True

    def _router_url(self, path: str) -> str:
        if self.router is None:
            raise ConfigError(["this client was built without router="])
        return f"{self.router}{path}"

    def _headers(self, traceparent: str | None) -> dict[str, str]:
        return {**self._auth, "traceparent": traceparent or tracing.child_traceparent(None)}


class AsyncClient(_Base):
    """A caller of the router (and the context service), for asyncio programs."""

    def __init__(
        self,
        *,
        router: str | None = None,
        token: str | None = None,
        context: str | None = None,
        timeout_s: float = 60.0,
        http: httpx.AsyncClient | None = None,
        ca_file: trust.PathLike | None = None,
    ) -> None:
        super().__init__(router, token, context, timeout_s, ca_file, own_http=http is None)
        self._http = http or httpx.AsyncClient(timeout=timeout_s, verify=self._verify)
        self._owns_http = http is None
        #: The context service's API (``create``, ``get``, ``patch``, ``close``), if ``context=`` was given.
        self.contexts: Contexts | None = (
            Contexts(self._http, self.context_url, self._token) if self.context_url else None
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _post(
        self, url: str, body: Any, traceparent: str | None, budget_s: float | None = None
    ) -> httpx.Response:
        try:
            return await self._http.post(
                url, json=body, headers=self._headers(traceparent), timeout=budget_s or self.timeout_s
            )
        except httpx.HTTPError as error:
            raise unreachable("router", self.router or "", error) from error

    async def _get(self, url: str, params: dict[str, str] | None = None) -> httpx.Response:
        try:
            return await self._http.get(url, params=params, headers=self._auth)
        except httpx.HTTPError as error:
            raise unreachable("router", self.router or "", error) from error

    async def invoke(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = None,
        policy: Policy | str | None = None,
        timeout_ms: int | None = None,
        deadline_ms: int | None = None,
        session_id: str | None = None,
        context_id: str | None = None,
        request_id: str | None = None,
        priority: Priority | str | None = None,
        traceparent: str | None = None,
    ) -> InvokeResult:
        """Calls ``capability`` and waits for its result envelope (raises the typed error on failure)."""
        body = invoke_body(
            capability,
            payload,
            version=version,
            policy=policy,
            timeout_ms=timeout_ms,
            deadline_ms=deadline_ms,
            session_id=session_id,
            context_id=context_id,
            request_id=request_id,
            priority=priority,
        )
        budget = (timeout_ms / 1000 + 2.0) if timeout_ms else None
        return invoke_result(await self._post(self._router_url("/v1/invoke"), body, traceparent, budget))

    async def submit_task(
        self,
        capability: str,
        payload: Any,
        *,
        callback_url: str | None = None,
        callback_secret_ref: str | None = None,
        version: str | None = None,
        session_id: str | None = None,
        context_id: str | None = None,
        request_id: str | None = None,
        priority: Priority | str | None = None,
        timeout_ms: int | None = None,
        traceparent: str | None = None,
    ) -> TaskAccepted:
        """Submits a durable task (answered once stored). A repeated ``request_id`` returns the existing task.
        ``callback_url`` gets the result envelope, signed (see :func:`verify_callback`)."""
        options = {
            "version": version,
            "session_id": session_id,
            "context_id": context_id,
            "request_id": request_id,
            "priority": priority,
            "timeout_ms": timeout_ms,
        }
        body = _task_body(capability, payload, callback_url, callback_secret_ref, options)
        return _accepted(router_answer(await self._post(self._router_url("/v1/tasks"), body, traceparent)))

    async def task(self, task_id: str) -> TaskView:
        return _task_view(router_answer(await self._get(self._router_url(f"/v1/tasks/{quote(task_id, safe='')}"))))

    async def cancel_task(self, task_id: str) -> TaskView:
        url = self._router_url(f"/v1/tasks/{quote(task_id, safe='')}/cancel")
        return _task_view(router_answer(await self._post(url, None, None)))

    async def wait_task(self, task_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.1) -> TaskView:
        """Polls the task until it ends (bounded by ``timeout_s``; raises ``TimeoutError`` past it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = await self.task(task_id)
            if view.done:
                return view
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task `{task_id}` still `{view.status}` after {timeout_s} s")
            await asyncio.sleep(poll_s)

    async def session_results(
        self, session_id: str, *, after: str | None = None, limit: int | None = None
    ) -> SessionResults:
        """Results of a session's tasks after the cursor ``after`` (the seeds' "pull what you missed")."""
        url = self._router_url(f"/v1/sessions/{quote(session_id, safe='')}/results")
        return _session_results(router_answer(await self._get(url, _results_params(after, limit))))


class Client(_Base):
    """A blocking caller of the router (and the context service), for scripts and sync code."""

    def __init__(
        self,
        *,
        router: str | None = None,
        token: str | None = None,
        context: str | None = None,
        timeout_s: float = 60.0,
        http: httpx.Client | None = None,
        ca_file: trust.PathLike | None = None,
    ) -> None:
        super().__init__(router, token, context, timeout_s, ca_file, own_http=http is None)
        self._http = http or httpx.Client(timeout=timeout_s, verify=self._verify)
        self._owns_http = http is None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, service: str, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, url, **kwargs)
        except httpx.HTTPError as error:
            raise unreachable(service, url, error) from error

    def invoke(
        self,
        capability: str,
        payload: Any,
        *,
        version: str | None = None,
        policy: Policy | str | None = None,
        timeout_ms: int | None = None,
        deadline_ms: int | None = None,
        session_id: str | None = None,
        context_id: str | None = None,
        request_id: str | None = None,
        priority: Priority | str | None = None,
        traceparent: str | None = None,
    ) -> InvokeResult:
        """See :meth:`AsyncClient.invoke`."""
        body = invoke_body(
            capability,
            payload,
            version=version,
            policy=policy,
            timeout_ms=timeout_ms,
            deadline_ms=deadline_ms,
            session_id=session_id,
            context_id=context_id,
            request_id=request_id,
            priority=priority,
        )
        budget = (timeout_ms / 1000 + 2.0) if timeout_ms else self.timeout_s
        response = self._send(
            "router",
            "POST",
            self._router_url("/v1/invoke"),
            json=body,
            headers=self._headers(traceparent),
            timeout=budget,
        )
        return invoke_result(response)

    def submit_task(
        self,
        capability: str,
        payload: Any,
        *,
        callback_url: str | None = None,
        callback_secret_ref: str | None = None,
        version: str | None = None,
        session_id: str | None = None,
        context_id: str | None = None,
        request_id: str | None = None,
        priority: Priority | str | None = None,
        timeout_ms: int | None = None,
        traceparent: str | None = None,
    ) -> TaskAccepted:
        """See :meth:`AsyncClient.submit_task`."""
        options = {
            "version": version,
            "session_id": session_id,
            "context_id": context_id,
            "request_id": request_id,
            "priority": priority,
            "timeout_ms": timeout_ms,
        }
        body = _task_body(capability, payload, callback_url, callback_secret_ref, options)
        response = self._send(
            "router", "POST", self._router_url("/v1/tasks"), json=body, headers=self._headers(traceparent)
        )
        return _accepted(router_answer(response))

    def task(self, task_id: str) -> TaskView:
        url = self._router_url(f"/v1/tasks/{quote(task_id, safe='')}")
        return _task_view(router_answer(self._send("router", "GET", url, headers=self._auth)))

    def cancel_task(self, task_id: str) -> TaskView:
        url = self._router_url(f"/v1/tasks/{quote(task_id, safe='')}/cancel")
        return _task_view(router_answer(self._send("router", "POST", url, headers=self._auth)))

    def wait_task(self, task_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.1) -> TaskView:
        """See :meth:`AsyncClient.wait_task`."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.task(task_id)
            if view.done:
                return view
            if time.monotonic() >= deadline:
                raise TimeoutError(f"task `{task_id}` still `{view.status}` after {timeout_s} s")
            time.sleep(poll_s)

    def session_results(self, session_id: str, *, after: str | None = None, limit: int | None = None) -> SessionResults:
        url = self._router_url(f"/v1/sessions/{quote(session_id, safe='')}/results")
        response = self._send("router", "GET", url, params=_results_params(after, limit), headers=self._auth)
        return _session_results(router_answer(response))

    # --- the context service (blocking twins of `Contexts`) ---

    def _context_url(self, path: str) -> str:
        if self.context_url is None:
            raise ConfigError(["this client was built without context="])
        return f"{self.context_url}{path}"

    def create_context(
        self, fields: dict[str, Any] | None = None, *, tier: str | None = None, context_id: str | None = None
    ) -> ContextView:
        body: dict[str, Any] = {}
        if context_id is not None:
            body["context_id"] = context_id
        if tier is not None:
            body["tier"] = tier
        if fields:
            body["fields"] = fields
        response = self._send("context", "POST", self._context_url("/v1/contexts"), json=body, headers=self._auth)
        answer = service_answer(response, "context")
        return ContextView(
            str(answer.get("context_id", "")),
            int(answer.get("version", 0)),
            str(answer.get("tier", "")),
            int(answer.get("expires_at", 0)),
            dict(fields or {}),
        )

    def get_context(self, context_id: str, fields: list[str] | None = None) -> ContextView:
        params = {"fields": ",".join(fields)} if fields else None
        url = self._context_url(f"/v1/contexts/{quote(context_id, safe='')}")
        return context_view(
            service_answer(self._send("context", "GET", url, params=params, headers=self._auth), "context")
        )

    def patch_context(
        self,
        context_id: str,
        *,
        set: dict[str, Any] | None = None,  # noqa: A002 - the API's own word
        delete: list[str] | None = None,
        if_version: int | None = None,
    ) -> int:
        url = self._context_url(f"/v1/contexts/{quote(context_id, safe='')}")
        response = self._send("context", "PATCH", url, json=patch_body(set, delete, if_version), headers=self._auth)
        return int(service_answer(response, "context").get("version", 0))

    def close_context(self, context_id: str) -> None:
        url = self._context_url(f"/v1/contexts/{quote(context_id, safe='')}")
        service_answer(self._send("context", "DELETE", url, headers=self._auth), "context")


def verify_callback(
    secret: bytes, signature_header: str, body: bytes, *, max_age_s: float = 300.0, now: float | None = None
) -> bool:
    """Checks a task callback's ``X-Agent-Reach-Signature: t=<unix>,v1=<hex>`` (HMAC-SHA256 of
    ``"<t>.<body>"``) in constant time, refusing timestamps older than ``max_age_s`` (replays)."""
    timestamp: int | None = None
    signature: bytes | None = None
    for part in signature_header.split(","):
        name, _, value = part.partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            try:
                signature = bytes.fromhex(value)
            except ValueError:
                return False
    if timestamp is None or signature is None:
        return False
    if abs((time.time() if now is None else now) - timestamp) > max_age_s:
        return False
    expected = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).digest()
    return hmac.compare_digest(expected, signature)
