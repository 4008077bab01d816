"""Test support: real etcd, Redis and the real ``agent-reach`` registry, router and
context service, on free loopback ports in temporary directories, killed afterwards
(the Python counterpart of ``testkit/src/lib.rs``).

Waiting is always polling a condition with a bound (:func:`wait_until`), never a bare
sleep. A missing binary fails with the package or build command that provides it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt

from .keys import SigningKey

REPO = Path(__file__).resolve().parents[4]
START_TIMEOUT_S = 30.0
SETUP_HINT = "run `scripts/setup.sh` (installs etcd-server and redis-server)"


def free_port() -> int:
    """A free port on 127.0.0.1 (another process could take it first; starts retry on a fresh one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    """Polls ``condition`` until it holds; fails the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except (httpx.HTTPError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def find_binary(name: str, package: str) -> str:
    found = shutil.which(name) or next(
        (str(Path(d) / name) for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin") if (Path(d) / name).is_file()),
        None,
    )
    if found is None:
        raise RuntimeError(f"`{name}` not found: install the Debian package `{package}`; {SETUP_HINT}")
    return found


def cargo_binary(name: str, package: str) -> str:
    """A binary of this workspace: in ``$AGENT_REACH_BIN_DIR`` when set (the bench points it
    at a release build), else the debug build in the cargo target directory."""
    directory = os.environ.get("AGENT_REACH_BIN_DIR")
    if directory:
        path = Path(directory) / name
    else:
        path = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug" / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `cargo build -p {package}` (`cargo test` builds it too)")
    return str(path)


class Process:
    """A child process with its output in a log file; killed (and reaped) by :meth:`stop`."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        self._file = open(log, "ab")  # noqa: SIM115 - held for the process's life
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.alive:
            self.popen.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.alive:
            self.popen.kill()
        self.popen.wait()
        self._file.close()


def _started(process: Process, ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if not process.alive:
            raise RuntimeError(f"{what} exited during start-up:\n{process.tail()}")
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError):
            pass
        if time.monotonic() >= deadline:
            process.stop()
            raise RuntimeError(f"{what} did not become ready in {START_TIMEOUT_S} s:\n{process.tail()}")
        time.sleep(0.02)


class Etcd:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.binary = find_binary("etcd", "etcd-server")
        self.process: Process | None = None
        self.client_port = 0
        for attempt in range(5):
            self.client_port, peer_port = free_port(), free_port()
            try:
                self._launch(peer_port)
                return
            except RuntimeError:
                if attempt == 4:
                    raise

    def _launch(self, peer_port: int) -> None:
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer_port}"
        argv = [
            self.binary,
            "--name=pytest",
            f"--data-dir={self.directory / f'etcd-{self.client_port}'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=pytest={peer}",
            "--initial-cluster-state=new",
            "--log-level=warn",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        env = {"ETCD_UNSUPPORTED_ARCH": os.uname().machine}
        self.process = Process(argv, self.directory / "etcd.log", env)
        _started(self.process, lambda: '"health":"true"' in httpx.get(f"{client}/health", timeout=0.5).text, "etcd")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def revoke_lease(self, lease_id: int) -> None:
        """Revokes a lease through etcd's JSON gateway (what an operator's `etcdctl lease revoke` does)."""
        response = httpx.post(f"{self.url}/v3/lease/revoke", json={"ID": str(lease_id)}, timeout=5.0)
        response.raise_for_status()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Redis:
    def __init__(self, directory: Path) -> None:
        binary = find_binary("redis-server", "redis-server")
        self.port = 0
        self.process: Process | None = None
        for attempt in range(5):
            self.port = free_port()
            argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory)]
            argv += ["--save", "", "--appendonly", "no", "--protected-mode", "yes"]
            self.process = Process(argv, directory / "redis.log")
            try:
                _started(self.process, self._pong, "redis-server")
                return
            except RuntimeError:
                if attempt == 4:
                    raise

    def _pong(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Service:
    """One `agent-reach SERVICE` process, ready when its `/readyz` answers 200. With ``tls``
    (certificate and key files) it serves https only and is probed trusting ``ca_file``."""

    def __init__(
        self,
        kind: str,
        args: list[str],
        directory: Path,
        port: int | None = None,
        tls: tuple[Path, Path] | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.kind = kind
        self.args = args
        if tls is not None:
            self.args = [*args, "--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1])]
        self.scheme = "https" if tls is not None else "http"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self.directory = directory
        self.binary = cargo_binary("agent-reach", "agent-reach-cli")
        self.port = port or free_port()
        self.process: Process | None = None
        self.start()

    def start(self) -> None:
        argv = [self.binary, "--log-format", "json", self.kind, "--listen", f"127.0.0.1:{self.port}", *self.args]
        self.process = Process(argv, self.directory / f"{self.kind}-{self.port}.log")
        _started(
            self.process,
            lambda: httpx.get(f"{self.url}/readyz", timeout=1.0, verify=self.verify).status_code == 200,
            self.kind,
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def restart(self) -> None:
        """Kills the service (SIGKILL) and starts it again on the same port."""
        self.stop()
        self.start()


ACL = """version: 1
permissions:
  - caller: tester
    allow: ["*"]
  - caller: py_agent
    allow: ["*"]
  - caller: demo_user
    allow: [intent.parse]
  - caller: summarizer
    allow: ["text.*"]
  - caller: assistant
    allow: ["text.*"]
  - caller: intent_parser
    allow: [order.query]
  - caller: order_query
    allow: [shipping.rules]
  - caller: shipping_rules
    allow: [reply.write]
  - caller: py_alice
    allow: ["test.chain.*"]
  - caller: py_bob
    allow: [test.chain.first]
  - caller: chain_first
    allow: [test.chain.middle]
    subjects: [py_alice]
  - caller: chain_middle
    allow: [test.chain.last]
    via: [chain_first]
  - caller: chain_relay
    allow: ["test.chain.*"]
auditors: [py_auditor]
providers:
  - agent: "*"
    provides: ["test.*", "text.*"]
  - agent: intent_parser
    provides: [intent.parse, intent.classify]
  - agent: order_query
    provides: [order.query, order.lookup]
  - agent: shipping_rules
    provides: [shipping.rules]
  - agent: reply_writer
    provides: [reply.write]
owners:
  - capability: "test.asked"
    approvers: [owner]
  - capability: "text.summarize"
    approvers: [owner]
context:
  - agent: tester
    read: ["*"]
    write: ["*"]
  - agent: py_agent
    read: ["*"]
    write: ["*"]
  - agent: summarizer
    read: [user_id]
    write: [summary_words]
  - agent: intent_parser
    write: [user_id, intent]
  - agent: order_query
    write: [order_status]
  - agent: reply_writer
    read: [user_id, intent, order_status]
"""


class Stack:
    """etcd + Redis + registry + router (tasks on) + context service, authentication on (HS256)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="agent-reach-pytest-"))
        self.secret = secrets.token_hex(32).encode()
        (self.directory / "hs256.secret").write_bytes(self.secret)
        (self.directory / "callback.secret").write_bytes(secrets.token_hex(32).encode())
        # The router's assertion key (Ed25519, PKCS#8 PEM), as `agent-reach keys generate` writes it;
        # tests that post straight to an agent sign their own assertions with it (`assertion`).
        self.router_key = SigningKey()
        self.assertion_key = self.router_key.private
        (self.directory / "assertion.pem").write_bytes(self.router_key.pem())
        (self.directory / "acl.yaml").write_text(ACL)
        self.parts: list[Any] = []
        try:
            self.etcd = self._keep(Etcd(self.directory))
            self.redis = self._keep(Redis(self.directory))
            auth = [
                "--acl",
                str(self.directory / "acl.yaml"),
                "--auth-hs256-secret-file",
                str(self.directory / "hs256.secret"),
            ]
            self.registry = self._keep(
                Service("registry", ["--etcd", self.etcd.url, "--min-ttl-s", "2", *auth], self.directory)
            )
            self.context = self._keep(Service("context", ["--redis", self.redis.url, *auth], self.directory))
            router_args = ["--registry", self.registry.url, "--redis", self.redis.url]
            router_args += [
                "--callback-secret-file",
                str(self.directory / "callback.secret"),
                "--allow-private-callbacks",
                "--assertion-key",
                str(self.directory / "assertion.pem"),
            ]
            self.auth = auth
            self.router = self._keep(Service("router", [*router_args, *auth], self.directory))
        except BaseException:
            self.stop()
            raise

    def _keep(self, part: Any) -> Any:
        self.parts.append(part)
        return part

    def token(self, name: str, ttl_s: int = 3600) -> str:
        now = int(time.time())
        return jwt.encode({"sub": name, "iat": now, "exp": now + ttl_s}, self.secret, algorithm="HS256")

    def assertion(self, *, audience: str, caller: str = "tester", capability: str = "test.echo", **claims: Any) -> str:
        """A hop assertion as the stack's router would sign it (its key, its ``kid``): for tests
        that post straight to an agent, standing in for the router."""
        return self.router_key.assertion(audience=audience, caller=caller, capability=capability, **claims)

    def start_router(self, args: list[str]) -> Service:
        """Another router on the same registry and ACL, authentication on, with ``args``
        (e.g. its own assertion keys); the caller stops it."""
        return Service("router", ["--registry", self.registry.url, *args, *self.auth], self.directory)

    def start_registry(self, args: list[str] | None = None, **service: Any) -> Service:
        """Another registry on the same etcd, ACL and secret (``service``: ``tls=``, ``ca_file=``);
        the caller stops it."""
        argv = ["--etcd", self.etcd.url, "--min-ttl-s", "2", *(args or []), *self.auth]
        return Service("registry", argv, self.directory, **service)

    def agent_env(self, name: str) -> dict[str, str]:
        """The environment an agent process reads its links from."""
        return {
            "AGENT_REACH_REGISTRY": self.registry.url,
            "AGENT_REACH_ROUTER": self.router.url,
            "AGENT_REACH_CONTEXT": self.context.url,
            "AGENT_REACH_TOKEN": self.token(name),
        }

    def registry_get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.registry.url}{path}", headers={"authorization": f"Bearer {self.token('tester')}"})

    def instance(self, agent_id: str) -> dict[str, Any] | None:
        response = self.registry_get(f"/v1/agents/{agent_id}")
        return response.json() if response.status_code == 200 else None

    def routable(self, capability: str, agent_id: str) -> bool:
        """Whether the router would send `capability` to `agent_id`: the registry
        resolves it and the router's snapshot holds it (its per-instance gauges, which
        `/metrics` publishes from the snapshot; the router learns of an instance a
        moment after the registry, longer on a loaded machine)."""
        response = self.registry_get(f"/v1/capabilities/{capability}")
        if response.status_code != 200:
            return False
        if not any(instance["agent_id"] == agent_id for instance in response.json()["instances"]):
            return False
        metrics = httpx.get(f"{self.router.url}/metrics", timeout=5)
        return f'agent_reach_router_instance_health_score{{agent_id="{agent_id}"}}' in metrics.text

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


__all__ = ["Process", "Stack", "free_port", "json_lines", "signal", "wait_until"]
