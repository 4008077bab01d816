"""An agent: its handlers, identity and links, and its life — serve, register,
heartbeat, re-register, drain, deregister.

Four ways to run it, one lifecycle:

- ``agent.run()``: blocks; serves on uvicorn; SIGTERM/SIGINT drain it.
- ``await agent.serve()``: the same inside your own event loop.
- ``agent.start()`` … ``agent.mark_ready()`` … ``agent.wait()``: serves from a
  background thread, so a script can initialise between start and ready (the seeds'
  ``AgentRuntime`` style).
- ``agent.asgi`` mounted into FastAPI/Starlette, with ``agent.lifespan`` in the host's lifespan.

Drain order (SIGTERM, ``stop()``, or the host's shutdown): report ``draining`` at once
(routers stop sending work; deliveries still arriving get 503, which the router retries
on another instance), wait for in-flight work up to ``drain_timeout_s``, deregister,
then stop serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import uvicorn

from . import logs, tracing, trust
from .access import AccessRequest, request_access
from .assertion import DEFAULT_ISSUER, INSECURE_ENV, JwksFile, JwksUrl, KeySource, Verifier, insecure_from_env
from .contexts import Contexts
from .ctx import Links
from .errors import ConfigError, HandlerDefinitionError, RegistrationRefused, RegistryError
from .handlers import Handler, build_handler
from .lifecycle import Lifecycle
from .logs import logger
from .registries import Registries, parse_registries
from .server import AgentApp, AgentState, other_routes
from .status import LoadThresholds, Status, StatusTracker

F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """One agent instance: ``name`` is its identity (the token's ``sub``, the ACL's name),
    ``agent_id`` this running instance (default ``NAME-xxxx``).

    Every link defaults to the environment variable the Rust example agents read:
    ``AGENT_REACH_REGISTRY``, ``AGENT_REACH_ROUTER``, ``AGENT_REACH_CONTEXT``,
    ``AGENT_REACH_TOKEN``; ``listen`` (``HOST:PORT``, default ``127.0.0.1:0``, a free port)
    and ``endpoint`` to ``AGENT_REACH_LISTEN`` and ``AGENT_REACH_ENDPOINT``. ``endpoint``
    is the externally reachable base URL the router calls (``{endpoint}/invoke``); it
    defaults to the bound address, which is right only when router and agent share a
    host: set it in production.

    The router's hop assertion is verified by default, with keys from
    ``{router}/.well-known/jwks.json`` (or ``jwks_url``, or a ``jwks_file``).
    ``insecure_accept_unverified=True`` (or ``AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED=1``)
    turns verification off, for development only, and says so loudly at start.

    ``registry`` may name several registries (a list, or comma separated as in
    ``AGENT_REACH_REGISTRY=http://r1:7400,http://r2:7400``): one is used at a time and any
    failure moves to the next, as the Rust SDK does. ``https://`` links (registries, router,
    JWKS, context service) are verified against the system's roots, or only against the CAs of
    ``ca_file`` (a PEM bundle; default ``AGENT_REACH_CA_FILE``).
    """

    def __init__(
        self,
        name: str,
        *,
        agent_id: str | None = None,
        endpoint: str | None = None,
        listen: str | None = None,
        registry: str | Sequence[str] | None = None,
        router: str | None = None,
        context: str | None = None,
        token: str | None = None,
        weight: int = 1,
        ttl_s: int = 15,
        tags: dict[str, str] | None = None,
        max_concurrency: int = 64,
        load_thresholds: LoadThresholds | None = None,
        drain_timeout_s: float = 30.0,
        max_body_bytes: int = 1024 * 1024,
        jwks_url: str | None = None,
        jwks_file: str | os.PathLike[str] | None = None,
        issuer: str = DEFAULT_ISSUER,
        insecure_accept_unverified: bool = False,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.agent_id = agent_id or f"{name}-{os.urandom(2).hex()}"
        self.endpoint = endpoint or os.environ.get("AGENT_REACH_ENDPOINT") or None
        self.listen = listen or os.environ.get("AGENT_REACH_LISTEN") or "127.0.0.1:0"
        #: The registries, in order (``registry=`` as a list or comma separated, or
        #: ``$AGENT_REACH_REGISTRY``): one is used at a time, any failure moves to the next.
        self.registries = parse_registries(registry or os.environ.get("AGENT_REACH_REGISTRY") or None)
        self.registry = self.registries[0] if self.registries else None
        self.router = router or os.environ.get("AGENT_REACH_ROUTER") or None
        self.context = context or os.environ.get("AGENT_REACH_CONTEXT") or None
        self.token = token or os.environ.get("AGENT_REACH_TOKEN") or None
        self.weight = weight
        self.ttl_s = ttl_s
        self.tags = dict(tags or {})
        self.max_concurrency = max_concurrency
        self.load_thresholds = load_thresholds or LoadThresholds()
        self.drain_timeout_s = drain_timeout_s
        self.max_body_bytes = max_body_bytes
        self.jwks_url = jwks_url
        self.jwks_file = jwks_file
        self.issuer = issuer
        self.insecure_accept_unverified = insecure_accept_unverified or insecure_from_env()
        self.ca_file = trust.ca_file_from(ca_file)
        self.handlers: list[Handler] = []
        self._on_start: list[Callable[[], Any]] = []
        self._state: AgentState | None = None
        self._running: _Running | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._pending_ready = False
        self._pending_load: Status | None = None
        self._stopped = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self.asgi = AgentApp(lambda: self._state, other_routes(lambda: self._state, self._asgi_lifespan))

    # === Declaring ===

    def handler(
        self,
        capability: str,
        *,
        version: str = "1.0.0",
        description: str | None = None,
        timeout_ms: int | None = None,
        input_schema: dict[str, Any] | bool | None = None,
        output_schema: dict[str, Any] | bool | None = None,
    ) -> Callable[[F], F]:
        """Declares the decorated function (sync or async) as the handler of ``capability`` at ``version``.

        Input and output schemas come from the payload parameter's and the return
        annotations (pydantic models, dataclasses, TypedDicts or plain types);
        ``input_schema``/``output_schema`` replace them with explicit JSON Schemas.
        ``timeout_ms`` is the capability's default deadline when a caller gives none;
        ``description`` defaults to the docstring's first line. Problems raise
        :class:`~agent_reach.errors.HandlerDefinitionError` here, at import.
        """

        def register(function: F) -> F:
            built = build_handler(
                function,
                capability=capability,
                version=version,
                description=description,
                timeout_ms=timeout_ms,
                input_schema=input_schema,
                output_schema=output_schema,
            )
            for existing in self.handlers:
                if (existing.descriptor.capability, existing.descriptor.version) == (capability, version):
                    raise HandlerDefinitionError(
                        built.name, capability, f"`{existing.name}` already handles `{capability}` {version}"
                    )
            if self._state is not None:
                raise HandlerDefinitionError(built.name, capability, "the agent has started; declare handlers before")
            self.handlers.append(built)
            return function

        return register

    def on_start(self, function: Callable[[], Any]) -> Callable[[], Any]:
        """Runs ``function`` (sync or async) after registration as ``starting`` and before
        ``run()``/``serve()`` mark the agent ready: load models, warm caches here."""
        self._on_start.append(function)
        return function

    # === State ===

    @property
    def status(self) -> Status:
        state = self._state
        return state.current_status() if state is not None else Status.STARTING

    @property
    def inflight(self) -> int:
        return self._state.inflight if self._state is not None else 0

    @property
    def is_registered(self) -> bool:
        """Whether the registry acknowledged a heartbeat within the last TTL."""
        return self._state is not None and self._state.heartbeat_fresh()

    @property
    def local_address(self) -> tuple[str, int] | None:
        """``(host, port)`` the agent serves on, once started by ``run``/``serve``/``start``."""
        return self._running.bound if self._running is not None else None

    def mark_ready(self) -> None:
        """The agent's own initialisation is done: accept traffic. Until then it is
        registered as ``starting`` and routers send it nothing. Thread-safe."""
        self._call_in_loop(self._mark_ready)

    def report_load(self, status: Status | str | None) -> None:
        """Reports load the SDK cannot see (a GPU queue, a rate-limited upstream):
        ``"busy"`` or ``"overloaded"``; ``None`` (or ``"ready"``) leaves it to the SDK's own
        in-flight thresholds again. The heavier of the two is reported. Thread-safe."""
        load = None if status is None else Status(status)
        if load not in (None, Status.READY, Status.BUSY, Status.OVERLOADED):
            raise ValueError(f"report_load takes busy, overloaded, ready or None, not {status!r}")
        self._call_in_loop(lambda: self._report_load(None if load is Status.READY else load))

    def _mark_ready(self) -> None:
        if self._state is None:
            self._pending_ready = True
            return
        if self._state.status.phase is Status.STARTING:
            self._state.status.phase = Status.READY
            self._state.note_status()

    def _report_load(self, load: Status | None) -> None:
        if self._state is None:
            self._pending_load = load
            return
        self._state.status.reported = load
        self._state.note_status()

    def _call_in_loop(self, function: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            function()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            function()
        else:
            loop.call_soon_threadsafe(function)

    # === Access ===

    async def request_access(self, capability: str, reason: str, *, ttl_s: int | None = None) -> AccessRequest:
        """Asks to call ``capability`` as this agent (``POST /v1/access-requests`` on its
        registry), with ``reason`` for the approvers ``owners:`` names in acl.yaml; once approved
        the grant lasts ``ttl_s`` seconds (``None``: until revoked). Safe at every start: a request
        still pending is answered again, not filed twice; ``status="allowed"`` once it may call.
        Raises :class:`RegistryError` with the registry's code (``CAPABILITY_NOT_FOUND``: no agent
        offers it yet; ``NO_OWNER``: no one could approve it)::

            @agent.on_start
            async def ask() -> None:
                await agent.request_access("payment.check", "order_query checks payments")
        """
        return await request_access(
            self.registries,
            self.token,
            trust.verify(self.ca_file),
            capability=capability,
            reason=reason,
            ttl_s=ttl_s,
        )

    # === Running ===

    def run(self, app: Any = None) -> None:
        """Serves until SIGTERM or SIGINT, then drains. Marks the agent ready once the
        ``on_start`` hooks have run. ``app`` serves a host ASGI app (e.g. FastAPI) that
        mounts ``agent.asgi``, instead of the agent's app alone."""
        asyncio.run(self.serve(app))

    async def serve(self, app: Any = None, *, ready: bool = True) -> None:
        """:meth:`run` inside a running event loop. With ``ready=False`` the agent stays
        ``starting`` until :meth:`mark_ready`."""
        running = await self._begin(app)
        signals = _install_signals(asyncio.get_running_loop(), self.request_stop)
        try:
            for hook in self._on_start:
                result = hook()
                if asyncio.iscoroutine(result):
                    await result
            if ready:
                self._mark_ready()
            assert self._stop_requested is not None
            await self._stop_requested.wait()
        finally:
            signals()
            await self._finish(running)

    def start(self, *, timeout_s: float = 30.0, handle_signals: bool = True) -> None:
        """Starts serving and registering (as ``starting``) from a background thread and
        returns; call :meth:`mark_ready` once the agent's own initialisation is done.

        SIGTERM/SIGINT (when called from the main thread, unless ``handle_signals`` is
        False) drain and stop it; the process stays up while it serves. :meth:`wait`
        blocks until it has stopped.
        """
        if self._thread is not None:
            raise RuntimeError("the agent is already started")
        self._started.clear()
        self._stopped.clear()
        self._start_error = None
        self._thread = threading.Thread(target=self._thread_main, name=f"agent-reach:{self.agent_id}")
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"the agent did not start within {timeout_s} s")
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise self._start_error
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.request_stop())

    def wait(self, timeout_s: float | None = None) -> bool:
        """Blocks until the agent started by :meth:`start` has stopped; True when it has."""
        # Short waits, so signal handlers run promptly in the waiting main thread.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stopped.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return True

    def stop(self, timeout_s: float | None = None) -> None:
        """Drains, deregisters and stops an agent started by :meth:`start`; blocks until done."""
        self.request_stop()
        self.wait(timeout_s)

    def request_stop(self) -> None:
        """Asks a running agent to drain and stop; returns at once. Thread- and signal-safe."""
        loop, event = self._loop, self._stop_requested
        if loop is None or event is None:
            return
        loop.call_soon_threadsafe(event.set)

    def _thread_main(self) -> None:
        async def main() -> None:
            try:
                running = await self._begin(None)
            except BaseException as error:  # noqa: BLE001 - handed to the starting thread
                self._start_error = error
                self._started.set()
                return
            self._started.set()
            try:
                assert self._stop_requested is not None
                await self._stop_requested.wait()
            finally:
                await self._finish(running)

        try:
            asyncio.run(main())
        finally:
            self._stopped.set()

    # === ASGI hosting ===

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """Starts the agent with a host ASGI app and drains it when the host shuts down::

            agent = Agent("summarizer", endpoint="https://summarizer.internal/agent")
            app = FastAPI(lifespan=agent.lifespan)
            app.mount("/agent", agent.asgi)

        ``endpoint`` must be given (the host's address is not known here). The agent is
        marked ready after its ``on_start`` hooks.
        """
        if self._state is not None:  # run(app=host)/serve(app=host) already manage the lifecycle
            yield
            return
        running = await self._begin(None, host_managed=True)
        try:
            for hook in self._on_start:
                result = hook()
                if asyncio.iscoroutine(result):
                    await result
            self._mark_ready()
            yield
        finally:
            await self._finish(running)

    @contextlib.asynccontextmanager
    async def _asgi_lifespan(self, app: Any) -> AsyncIterator[None]:
        # Served standalone by a server that runs this app's lifespan (`uvicorn module:agent.asgi`).
        async with self.lifespan(app):
            yield

    # === The lifecycle itself ===

    def _problems(self, host_managed: bool) -> list[str]:
        problems: list[str] = []
        if not self.name:
            problems.append("name is empty")
        if not self.handlers:
            problems.append("no handler: declare one with @agent.handler(...)")
        if not self.registries:
            problems.append("no registry URL: pass registry= or set AGENT_REACH_REGISTRY")
        for url in self.registries:
            if urlsplit(url).scheme not in ("http", "https"):
                problems.append(f"registry must be an http:// or https:// URL, not `{url}`")
        problems += trust.problems(self.ca_file)
        if not self.token:
            problems.append("no token: pass token= (a JWT whose sub is the agent name) or set AGENT_REACH_TOKEN")
        if not 1 <= self.weight <= 1000:
            problems.append(f"weight must be 1..=1000, not {self.weight}")
        if self.ttl_s < 1:
            problems.append(f"ttl_s must be positive, not {self.ttl_s}")
        if self.max_concurrency < 1:
            problems.append(f"max_concurrency must be at least 1, not {self.max_concurrency}")
        problems += self.load_thresholds.problems()
        if host_managed and not self.endpoint:
            problems.append("endpoint is required when a host app serves the agent (its address is not known here)")
        if self.endpoint and urlsplit(self.endpoint).scheme not in ("http", "https"):
            problems.append(f"endpoint must be an http:// or https:// URL, not `{self.endpoint}`")
        if not self.insecure_accept_unverified and not (self.jwks_file or self.jwks_url or self.router):
            problems.append(
                "verifying the router's assertions needs its keys: pass router= (JWKS at "
                "/.well-known/jwks.json), jwks_url= or jwks_file=, or, for development only, "
                f"insecure_accept_unverified=True ({INSECURE_ENV}=1)"
            )
        return problems

    def _key_source(self) -> KeySource | None:
        if self.insecure_accept_unverified:
            return None
        if self.jwks_file:
            return JwksFile(self.jwks_file)
        url = self.jwks_url or f"{(self.router or '').rstrip('/')}/.well-known/jwks.json"
        return JwksUrl(url)

    async def _begin(self, app: Any, *, host_managed: bool = False) -> _Running:
        if self._state is not None:
            raise RuntimeError("the agent is already running")
        problems = self._problems(host_managed)
        if problems:
            raise ConfigError(problems)
        logs.install()
        bound: tuple[str, int] | None = None
        sock: socket.socket | None = None
        if not host_managed:
            sock, bound = _bind(self.listen)
        endpoint = (
            self.endpoint or f"http://{_host_for_url(bound[0] if bound else '127.0.0.1')}:{bound[1] if bound else 0}"
        )
        _warn_about_endpoint(endpoint)
        if self.insecure_accept_unverified:
            logger.warning(
                "ROUTER ASSERTIONS ARE NOT VERIFIED (insecure_accept_unverified / %s): anyone who can reach "
                "%s can call this agent as anyone. Development only; never run this in production.",
                INSECURE_ENV,
                endpoint,
            )
        http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max(100, self.max_concurrency * 2)), verify=trust.verify(self.ca_file)
        )
        token = self.token or ""
        contexts = Contexts(http, self.context, token) if self.context else None
        source = self._key_source()
        verifier = Verifier(source, audience=self.agent_id, issuer=self.issuer) if source is not None else None
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        state = AgentState(
            agent_id=self.agent_id,
            handlers=list(self.handlers),
            links=Links(http=http, router=self.router, contexts=contexts, token=token),
            verifier=verifier,
            max_concurrency=self.max_concurrency,
            max_body_bytes=self.max_body_bytes,
            ttl_s=self.ttl_s,
            status=StatusTracker(self.max_concurrency, self.load_thresholds),
        )
        state.spans = tracing.otel_active()
        if self._pending_ready:
            state.status.phase = Status.READY
        state.status.reported = self._pending_load
        invoke_url = f"{endpoint.rstrip('/')}/invoke"

        def registration(status: Status) -> dict[str, Any]:
            body: dict[str, Any] = {
                "agent_id": self.agent_id,
                "name": self.name,
                "endpoint": invoke_url,
                "protocol": "http",
                "weight": self.weight,
                "ttl_s": self.ttl_s,
                "status": str(status),
                "capabilities": [handler.descriptor.to_wire() for handler in self.handlers],
            }
            if self.tags:
                body["tags"] = self.tags
            return body

        lifecycle = Lifecycle(state, http, Registries(self.registries), token, registration)
        server: _Server | None = None
        serving: asyncio.Task[None] | None = None
        try:
            if source is not None:
                await source.start(http)
            self._state = state
            if sock is not None:
                config = uvicorn.Config(
                    app if app is not None else self.asgi,
                    log_config=None,
                    access_log=False,
                    lifespan="auto" if app is not None else "off",
                    timeout_graceful_shutdown=5,
                )
                server = _Server(config)
                serving = asyncio.create_task(server.serve(sockets=[sock]), name="agent_reach.server")
                await _until_started(server, serving)
            await lifecycle.start(lambda error: _refusal(error, self.handlers))
        except BaseException:
            self._state = None
            if server is not None and serving is not None:
                server.should_exit = True
                with contextlib.suppress(BaseException):
                    await serving
            if source is not None:
                await source.close()
            await http.aclose()
            if sock is not None:
                sock.close()
            raise
        running = _Running(state, lifecycle, http, source, server, serving, bound)
        self._running = running
        return running

    async def _finish(self, running: _Running) -> None:
        """Drain: ``draining`` → in-flight work ends (bounded) → deregister → stop serving."""
        state = running.state
        state.status.phase = Status.DRAINING
        state.note_status()
        logger.info("Draining.", extra={"agent_id": self.agent_id, "inflight": state.inflight})
        await running.lifecycle.announce_draining()
        try:
            await asyncio.wait_for(state.idle.wait(), timeout=self.drain_timeout_s)
        except TimeoutError:
            logger.warning("Drain timeout: deregistering with work in flight.", extra={"inflight": state.inflight})
        else:
            logger.info(
                "Drained: no delivery in flight.", extra={"agent_id": self.agent_id, "inflight": state.inflight}
            )
        background = set(state.links.background)
        if background:
            # Accepted tasks report before the agent leaves (bounded like the in-flight wait).
            _, pending = await asyncio.wait(background, timeout=self.drain_timeout_s)
            if pending:
                logger.warning("Drain timeout: accepted work still running.", extra={"tasks": len(pending)})
        await running.lifecycle.stop()
        await running.lifecycle.deregister()
        if running.server is not None and running.serving is not None:
            running.server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await running.serving
        if running.source is not None:
            await running.source.close()
        await running.http.aclose()
        self._state = None
        self._running = None
        self._loop = None
        self._pending_ready = False


class _Running:
    def __init__(
        self,
        state: AgentState,
        lifecycle: Lifecycle,
        http: httpx.AsyncClient,
        source: KeySource | None,
        server: _Server | None,
        serving: asyncio.Task[None] | None,
        bound: tuple[str, int] | None,
    ) -> None:
        self.state = state
        self.lifecycle = lifecycle
        self.http = http
        self.source = source
        self.server = server
        self.serving = serving
        self.bound = bound


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handling: the agent drains before the server stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def _until_started(server: _Server, serving: asyncio.Task[None]) -> None:
    # uvicorn sets `started` once listening; a failed start ends the task instead.
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("the agent's HTTP server stopped during start-up")
        await asyncio.sleep(0.01)


def _install_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM/SIGINT → drain (main thread only); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop)
            installed.append(sig)

    def undo() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return undo


def _bind(listen: str) -> tuple[socket.socket, tuple[str, int]]:
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError as error:
        raise ConfigError([f"listen must be HOST:PORT, not `{listen}`"]) from error
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio disables Nagle only on sockets whose `proto` says
    # TCP, and accepted sockets inherit it. Without it every answer after a connection's first
    # waits ~40 ms for the router's delayed ACK (headers and body are two writes).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigError([f"cannot listen on {listen}: {error.strerror}"]) from error
    sock.listen(1024)
    sock.setblocking(False)
    bound = sock.getsockname()
    return sock, (str(bound[0]), int(bound[1]))


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _warn_about_endpoint(endpoint: str) -> None:
    """Loud warnings for endpoints the router usually cannot reach (DESIGN §2)."""
    host = urlsplit(endpoint).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host == "localhost":
            address = ipaddress.ip_address("127.0.0.1")
        else:
            return
    if address.is_unspecified:
        logger.warning(
            "ENDPOINT %s IS NOT AN ADDRESS ANYONE CAN CALL: set endpoint= to the URL the router reaches.", endpoint
        )
    elif address.is_loopback:
        logger.warning(
            "Endpoint %s is a loopback address: only a router on this host can reach it. "
            "Set endpoint= to the externally reachable URL in production.",
            endpoint,
        )
    elif address in ipaddress.ip_network("172.17.0.0/16"):
        logger.warning(
            "Endpoint %s looks like a container-internal address (Docker's bridge network): a router "
            "outside the container cannot reach it. Set endpoint= to the published URL.",
            endpoint,
        )


def _refusal(error: RegistryError, handlers: list[Handler]) -> RegistrationRefused:
    """The registry's refusal, naming the handler when it pointed at a capability."""
    handler_name: str | None = None
    message = error.message
    field = error.field or ""
    if field.startswith("capabilities["):
        index_text = field[len("capabilities[") :].split("]", 1)[0]
        if index_text.isdigit() and int(index_text) < len(handlers):
            handler = handlers[int(index_text)]
            handler_name = handler.name
            message = f"handler `{handler.name}` for `{handler.descriptor.capability}`: {message}"
    return RegistrationRefused(
        error.code,
        f"the registry refused the registration: {message}",
        status=error.status,
        field=error.field,
        handler=handler_name,
    )
