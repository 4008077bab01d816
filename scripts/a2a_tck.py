"""Runs the A2A conformance suite (a2aproject/a2a-tck, a checkout given by path) against
the router, docs/protocols.md#the-a2a-tck: a real stack (etcd, Redis, registry, router with
durable tasks, context service; `sdk/python/tests/support`) and an agent serving
`text.tck_echo` (a TextPart in, its text back), then the TCK's `run_tck.py` on every
category, its bearer token from the stack. The TCK runs in its own virtualenv (created in
the checkout on first use, from its pinned requirements); its JSON report is written where
`--report` says and the per-category counts printed. Nothing here is copied from the TCK.

The TCK reaches the router through a relay of this script's (every request and answer
passed through unchanged, streams as they come; the cards' JSON-RPC and REST URLs name
the relay) that changes two things more, both where the TCK's clients contradict the spec
(docs/protocols.md lists them):
- the gRPC interface of the cards it serves gets an `http://` scheme. The card says
  `host:port`, the spec's form for gRPC (§4.4.6, what the official clients take), and the
  TCK's gRPC client reads its address with `urlparse`, which finds no host in `host:port`;
- a REST call to the host's root (`/message:send`, `/tasks/…`, `/extendedAgentCard`) goes
  to the REST interface's path, `/a2a/{capability}/v1/…`: the TCK's REST client joins its
  paths to the interface URL with `urljoin(url, "/message:send")`, which drops the URL's
  path, while an interface URL may have one (§4.4.6, §11.3).

    .venv/bin/python scripts/a2a_tck.py /path/to/a2a-tck [--a2a-tasks always|when-asked]
        [--report report.json] [run_tck args...]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "sdk" / "python"))

import httpx  # noqa: E402
from agent_reach import Agent  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from tests.support.stack import Stack, free_port, wait_until  # noqa: E402

CAPABILITY = "text.tck_echo"


class Said(BaseModel):
    text: str


class Relay:
    """An HTTP/1.1 relay to `upstream`: requests and answers unchanged (an answer of unknown
    length, a stream, relayed as it comes), except an agent card's gRPC interface, given a
    scheme for the TCK's gRPC client, and REST calls to the root, sent to the REST
    interface's path."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    key: value
                    for key, value in self.headers.items()
                    if key.lower() not in ("host", "content-length")
                }
                with (
                    httpx.Client(timeout=None) as client,
                    client.stream(
                        self.command,
                        relay.upstream + relay.path(self.path),
                        headers=headers,
                        content=body,
                    ) as answer,
                ):
                    self.send_response(answer.status_code)
                    for key, value in answer.headers.items():
                        if key.lower() not in (
                            "content-length",
                            "transfer-encoding",
                            "connection",
                        ):
                            self.send_header(key, value)
                    if (
                        self.path.endswith("/.well-known/agent-card.json")
                        and answer.status_code == 200
                    ):
                        card = relay.card(json.loads(answer.read()))
                        self.send_header("content-length", str(len(card)))
                        self.end_headers()
                        self.wfile.write(card)
                        return
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.iter_raw():
                        self.wfile.write(
                            f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                        )
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_DELETE = do_PUT = relay

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", free_port()), Handler
        )
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def path(self, path: str) -> str:
        """A REST call the TCK sent to the host's root (its REST client joins
        `/message:send` and the like to the interface's URL with `urljoin`, which drops
        the URL's path) goes to the interface's path, `/a2a/{capability}/v1`."""
        if path.startswith(("/message:", "/tasks", "/extendedAgentCard")):
            return f"/a2a/{CAPABILITY}/v1{path}"
        return path

    def card(self, card: dict[str, Any]) -> bytes:
        for interface in card.get("supportedInterfaces", []):
            url = interface.get("url", "")
            if interface.get("protocolBinding") == "GRPC" and "://" not in url:
                interface["url"] = "http://" + url
            elif url.startswith(self.upstream):
                # The router names the host it was asked on, its own: the relay's instead.
                interface["url"] = self.url + url[len(self.upstream) :]
        return json.dumps(card).encode()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tck_python(checkout: Path) -> Path:
    """The TCK's own interpreter: a virtualenv in the checkout, made once."""
    venv = checkout / ".venv-agent-reach"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-e", str(checkout)],
            check=True,
        )
    return python


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "checkout", type=Path, help="a checkout of github.com/a2aproject/a2a-tck"
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=Path("tck-report.json"),
        help="where the JSON report goes",
    )
    parser.add_argument(
        "--category", default="all", help="run_tck.py's --category (default: all)"
    )
    parser.add_argument(
        "--a2a-tasks",
        choices=["when-asked", "always"],
        default="always",
        help="the router's --a2a-tasks (default always: the TCK expects every send to answer a Task)",
    )
    args, extra = parser.parse_known_args()
    checkout = args.checkout.resolve()
    python = tck_python(checkout)
    stack = Stack()
    agent = Agent(
        "py_agent",
        registry=stack.registry.url,
        router=stack.router.url,
        context=stack.context.url,
        token=stack.token("py_agent"),
        ttl_s=5,
    )

    @agent.handler(CAPABILITY, version="1.0.0")
    async def echo(payload: Said) -> Said:
        """Echo the text back, after the TCK's reference agent's 1.2 s: several TCK
        tests look at a task while it still works."""
        await asyncio.sleep(1.2)
        return Said(text=payload.text)

    router = None
    try:
        agent.start(handle_signals=False)
        agent.mark_ready()
        wait_until(
            lambda: stack.routable(CAPABILITY, agent.agent_id),
            20,
            "the echo capability routable",
        )
        # The TCK reads the card at the host root: a router serving the echo's card there,
        # with the stack's tasks, callback secret and assertion key.
        directory = stack.directory
        router = stack.start_router(
            [
                "--a2a-tasks",
                args.a2a_tasks,
                "--a2a-root-capability",
                CAPABILITY,
                "--redis",
                stack.redis.url,
                "--callback-secret-file",
                str(directory / "callback.secret"),
                "--allow-private-callbacks",
                "--assertion-key",
                str(directory / "assertion.pem"),
            ]
        )
        wait_until(
            lambda: (
                httpx.get(
                    f"{router.url}/.well-known/agent-card.json", timeout=5
                ).status_code
                == 200
            ),
            20,
            "the root agent card",
        )
        env = {
            **os.environ,
            "A2A_AUTH_TYPE": "bearer",
            "A2A_AUTH_TOKEN": stack.token("tester", ttl_s=6 * 3600),
        }
        relay = Relay(router.url)
        report = args.report.resolve()
        command = [
            str(python),
            "run_tck.py",
            "--sut-url",
            f"{relay.url}/a2a/{CAPABILITY}",
            "--category",
            args.category,
            "--compliance-report",
            str(report),
            *extra,
        ]
        print("+", " ".join(command), flush=True)
        finished = subprocess.run(command, cwd=checkout, env=env, check=False)
        relay.stop()
        summarize(checkout)
        return finished.returncode
    finally:
        if router is not None:
            router.stop()
        agent.stop(timeout_s=10)
        stack.stop()


def summarize(checkout: Path) -> None:
    """Per-category pass/fail/skip counts from the pytest JSON reports the TCK wrote."""
    for path in sorted(checkout.glob("reports/*.json")):
        try:
            tests = json.loads(path.read_text()).get("tests", [])
        except (OSError, ValueError):
            continue
        counts = Counter(test.get("outcome", "?") for test in tests)
        if counts:
            print(
                f"{path.name}: "
                + ", ".join(
                    f"{outcome} {count}" for outcome, count in sorted(counts.items())
                )
            )


if __name__ == "__main__":
    raise SystemExit(main())
