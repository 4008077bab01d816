"""The context service's HTTP API (DESIGN §4): versioned, access-controlled session context.

:class:`Contexts` is the raw API (used by :class:`~agent_reach.Client`);
:class:`ContextHandle` is one context bound to a request (``ctx.context`` in a handler).
Reads return only the fields the caller's ``read`` whitelist allows; patches set and
delete named fields atomically, optionally only if the version still matches.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import quote

import anyio.from_thread
import httpx

from .errors import ContextError
from .wire import ContextView, context_view, patch_body, service_answer, unreachable

T = TypeVar("T")


class Contexts:
    """``/v1/contexts`` on one context service, authenticated with ``token``."""

    def __init__(self, http: httpx.AsyncClient, url: str, token: str) -> None:
        self._http = http
        self._url = url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}

    async def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self._url}{path}"
        try:
            response = await self._http.request(method, url, headers=self._headers, **kwargs)
        except httpx.HTTPError as error:
            raise unreachable("context", self._url, error) from error
        return service_answer(response, "context")

    async def create(
        self,
        fields: dict[str, Any] | None = None,
        *,
        tier: str | None = None,
        context_id: str | None = None,
    ) -> ContextView:
        """Creates a context (tier ``default`` or ``one_shot``); returns its id and version."""
        body: dict[str, Any] = {}
        if context_id is not None:
            body["context_id"] = context_id
        if tier is not None:
            body["tier"] = tier
        if fields:
            body["fields"] = fields
        answer = await self._send("POST", "/v1/contexts", json=body)
        return ContextView(
            context_id=str(answer.get("context_id", "")),
            version=int(answer.get("version", 0)),
            tier=str(answer.get("tier", "")),
            expires_at_ms=int(answer.get("expires_at", 0)),
            fields=dict(fields or {}),
        )

    async def get(self, context_id: str, fields: list[str] | None = None) -> ContextView:
        """Reads ``fields`` (all the caller may read when None)."""
        params = {"fields": ",".join(fields)} if fields else None
        return context_view(await self._send("GET", f"/v1/contexts/{quote(context_id, safe='')}", params=params))

    async def patch(
        self,
        context_id: str,
        *,
        set: dict[str, Any] | None = None,  # noqa: A002 - the API's own word
        delete: list[str] | None = None,
        if_version: int | None = None,
    ) -> int:
        """Sets and deletes fields atomically; returns the new version.

        With ``if_version`` the patch applies only at that version, else
        :class:`~agent_reach.errors.VersionConflict` (its ``current_version`` tells the version to re-read).
        """
        body = patch_body(set, delete, if_version)
        answer = await self._send("PATCH", f"/v1/contexts/{quote(context_id, safe='')}", json=body)
        return int(answer.get("version", 0))

    async def close(self, context_id: str) -> None:
        """Deletes the context at once (its creator, or an agent with ``write: ["*"]``)."""
        await self._send("DELETE", f"/v1/contexts/{quote(context_id, safe='')}")


class ContextHandle:
    """The session context a request names (``context_id``), as a handler sees it.

    Async methods for async handlers; ``*_sync`` twins for sync handlers (they run the
    call on the agent's event loop and block the worker thread until it answers).
    """

    def __init__(self, contexts: Contexts | None, context_id: str | None) -> None:
        self._contexts = contexts
        self.context_id = context_id

    def _parts(self) -> tuple[Contexts, str]:
        if self._contexts is None:
            raise ContextError(
                "NO_CONTEXT_SERVICE", "this agent was built without a context service URL (Agent(context=...))"
            )
        if not self.context_id:
            raise ContextError("NO_CONTEXT", "this request carries no context_id")
        return self._contexts, self.context_id

    async def get(self, fields: list[str] | None = None) -> ContextView:
        contexts, context_id = self._parts()
        return await contexts.get(context_id, fields)

    async def patch(
        self,
        *,
        set: dict[str, Any] | None = None,  # noqa: A002 - the API's own word
        delete: list[str] | None = None,
        if_version: int | None = None,
    ) -> int:
        contexts, context_id = self._parts()
        return await contexts.patch(context_id, set=set, delete=delete, if_version=if_version)

    async def close(self) -> None:
        contexts, context_id = self._parts()
        await contexts.close(context_id)

    def get_sync(self, fields: list[str] | None = None) -> ContextView:
        return blocking(self.get, fields)

    def patch_sync(
        self,
        *,
        set: dict[str, Any] | None = None,  # noqa: A002 - the API's own word
        delete: list[str] | None = None,
        if_version: int | None = None,
    ) -> int:
        async def run() -> int:
            return await self.patch(set=set, delete=delete, if_version=if_version)

        return blocking(run)

    def close_sync(self) -> None:
        blocking(self.close)


def blocking(function: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """Runs an async SDK call from a sync handler's worker thread on the agent's event loop."""
    # AnyIO sets this thread-local in its worker threads only (where sync handlers run).
    if getattr(getattr(anyio.from_thread, "threadlocals", None), "current_token", None) is None:
        raise RuntimeError(
            "the *_sync methods work inside a sync handler (its worker thread); "
            "in an async handler `await` the plain methods"
        )
    return anyio.from_thread.run(function, *args)
