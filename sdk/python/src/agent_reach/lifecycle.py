"""Registration and liveness over the registry's HTTP API (DESIGN §2).

``POST /v1/agents`` registers the instance (as ``starting`` until ``mark_ready``),
``PUT /v1/agents/{id}/heartbeat`` every ``heartbeat_interval_s`` (TTL/3) and at once
whenever the status to report changes, with the in-flight count. ``LEASE_EXPIRED``
(the lease was revoked, expired while the registry or network was away, or replaced)
means register again; an unreachable registry means keep trying with capped
exponential backoff, so an agent outlives a registry restart by itself.
``DELETE /v1/agents/{id}`` deregisters when the agent stops.

With several registries (:class:`~agent_reach.registries.Registries`) every failure moves to
the next one, which is tried at once; the backoff applies only after each failed in a row
(as the Rust SDK does). They share one etcd: a lease granted through one is renewed through any.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from .errors import AgentReachError, LeaseExpired, RegistrationRefused, RegistryError
from .logs import logger
from .registries import Registries
from .server import AgentState
from .status import Status
from .wire import service_answer, unreachable

MAX_BACKOFF_S = 5.0
#: Status changes are sent at most this often, so a load hovering at a threshold
#: cannot become a stream of registry (and etcd) writes.
MIN_STATUS_INTERVAL_S = 0.5


class Lifecycle:
    def __init__(
        self,
        state: AgentState,
        http: httpx.AsyncClient,
        registries: Registries,
        token: str,
        registration: Callable[[Status], dict[str, Any]],
    ) -> None:
        self.state = state
        self.http = http
        self.registries = registries
        self.headers = {"authorization": f"Bearer {token}"}
        self.registration = registration
        self.lease_id: int | None = None
        self.interval_s = 5.0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._last_status_sent = 0.0
        #: Failures in a row: the next registry is tried at once until each failed once.
        self._failures = 0

    @property
    def registry(self) -> str:
        """The registry in use."""
        return self.registries.current

    @property
    def agent_path(self) -> str:
        return f"{self.registry}/v1/agents/{quote(self.state.agent_id, safe='')}"

    def _failed(self) -> bool:
        """The registry in use failed: move to the next; True when that one is to be tried at
        once (not every registry has failed in a row yet), False when the backoff applies."""
        self.registries.failed()
        self._failures += 1
        if self._failures < len(self.registries):
            return True
        self._failures = 0
        return False

    async def register(self) -> None:
        """One registration; raises :class:`RegistryError` or a transport error."""
        status = self.state.current_status()
        # A draining agent never registers anew; its last life ends with the lease.
        body = self.registration(Status.STARTING if status is Status.DRAINING else status)
        try:
            response = await self.http.post(f"{self.registry}/v1/agents", json=body, headers=self.headers, timeout=5.0)
        except httpx.HTTPError as error:
            raise unreachable("registry", self.registry, error) from error
        answer = service_answer(response, "registry")
        self.lease_id = int(answer["lease_id"])
        self.interval_s = max(0.5, float(answer.get("heartbeat_interval_s") or 5))
        self.state.last_heartbeat = time.monotonic()
        self.state.last_status = status
        logger.info(
            "Registered.", extra={"agent_id": self.state.agent_id, "lease_id": self.lease_id, "status": str(status)}
        )

    async def start(self, first_registration: Callable[[RegistryError], RegistrationRefused]) -> None:
        """Registers once (a definitive refusal raises, via ``first_registration``), then keeps alive in the background.

        Each registry is tried once, the first given first. Unreachable or failing registries do not
        stop the start: the background loop keeps trying.
        """
        for _ in range(len(self.registries)):
            try:
                await self.register()
                break
            except RegistryError as error:
                # The registries share one catalog: a refusal from one is everyone's.
                if error.status is not None and 400 <= error.status < 500:
                    raise first_registration(error) from error
                logger.warning("Registration failed.", extra={"registry": self.registry, "error": str(error)})
            except AgentReachError as error:
                logger.warning("Registration failed.", extra={"registry": self.registry, "error": str(error)})
            self.registries.failed()
        else:
            logger.warning("Registration failed on every registry; retrying in the background.")
        self._task = asyncio.create_task(self._run(), name="agent_reach.lifecycle")

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            if self.lease_id is None:
                try:
                    await self.register()
                    backoff = 0.1
                    self._failures = 0
                except AgentReachError as error:
                    logger.warning(
                        "Registration failed; retrying.",
                        extra={"registry": self.registry, "error": str(error), "retry_in_s": backoff},
                    )
                    if self._failed():
                        continue
                    if await self._wait(backoff):
                        return
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
            # Wait for the next beat, a status change (not sooner than the minimum spacing) or the stop.
            if await self._wait_for_beat():
                return
            if await self._beat():
                backoff = 0.1
                continue
            if await self._wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _beat(self) -> bool:
        """Heartbeats, through the next registries at once when the one in use fails; False when
        every registry failed in a row (the caller backs off)."""
        while True:
            try:
                await self.heartbeat()
                self._failures = 0
                return True
            except LeaseExpired:
                logger.warning("Lease expired; registering again.", extra={"agent_id": self.state.agent_id})
                self.lease_id = None
                return True
            except AgentReachError as error:
                logger.warning("Heartbeat failed.", extra={"registry": self.registry, "error": str(error)})
                if not self._failed():
                    return False

    async def heartbeat(self) -> None:
        """One heartbeat with the current status and in-flight count."""
        if self.lease_id is None:
            return
        status = self.state.current_status()
        self.state.status_changed.clear()
        body = {"lease_id": self.lease_id, "status": str(status), "inflight": self.state.take_sustained_inflight()}
        self._last_status_sent = time.monotonic()
        try:
            response = await self.http.put(f"{self.agent_path}/heartbeat", json=body, headers=self.headers, timeout=5.0)
        except httpx.HTTPError as error:
            raise unreachable("registry", self.registry, error) from error
        service_answer(response, "registry")
        self.state.last_heartbeat = time.monotonic()

    async def _wait_for_beat(self) -> bool:
        """Sleeps until a heartbeat is due; True when asked to stop meanwhile."""
        deadline = time.monotonic() + self.interval_s
        while True:
            if self._stopping.is_set():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.state.status_changed.is_set():
                spacing = self._last_status_sent + MIN_STATUS_INTERVAL_S - time.monotonic()
                if spacing <= 0:
                    return False
                if await self._wait(min(spacing, remaining)):
                    return True
                continue
            waiters = [
                asyncio.ensure_future(self.state.status_changed.wait()),
                asyncio.ensure_future(self._stopping.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    async def _wait(self, seconds: float) -> bool:
        """Sleeps ``seconds``; True when asked to stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        return self._stopping.is_set()

    async def announce_draining(self) -> None:
        """Sends ``draining`` at once (bounded), so routers stop sending work before in-flight work ends."""
        try:
            await asyncio.wait_for(self.heartbeat(), timeout=2.0)
        except (AgentReachError, TimeoutError) as error:
            logger.warning("Could not report draining; deregistering soon anyway.", extra={"error": str(error)})

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def deregister(self) -> None:
        """Deregisters, each registry getting one try (the one in use first)."""
        for _ in range(len(self.registries)):
            try:
                response = await self.http.delete(self.agent_path, headers=self.headers, timeout=5.0)
                service_answer(response, "registry")
                logger.info("Deregistered.", extra={"agent_id": self.state.agent_id})
                return
            except RegistryError as error:
                if error.status is not None and 400 <= error.status < 500:
                    # Definitive (e.g. the lease is gone already): another registry would say the same.
                    logger.warning("Deregistration refused.", extra={"registry": self.registry, "error": str(error)})
                    return
                logger.warning("Deregistration failed.", extra={"registry": self.registry, "error": str(error)})
                self.registries.failed()
            except (httpx.HTTPError, AgentReachError) as error:
                logger.warning("Deregistration failed.", extra={"registry": self.registry, "error": str(error)})
                self.registries.failed()
        logger.warning("Deregistration failed on every registry; the lease will expire.")
