"""The bench's baseline: a bare ASGI echo app on the same uvicorn settings as the SDK,
speaking the agent contract by hand (decode the envelope, answer {"output": payload})
and registering itself through the registry's HTTP API, with heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Any

import httpx
import uvicorn

AGENT_ID = "bench_bare-1"
REGISTRY = os.environ["AGENT_REACH_REGISTRY"]
HEADERS = {"authorization": f"Bearer {os.environ['AGENT_REACH_TOKEN']}"}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    message = await receive()
    body = message.get("body", b"")
    while message.get("more_body", False):
        message = await receive()
        body += message.get("body", b"")
    envelope = json.loads(body)
    answer = json.dumps({"output": envelope["payload"]}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(answer)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def keep_registered(port: int) -> None:
    async with httpx.AsyncClient() as http:
        registration = {
            "agent_id": AGENT_ID,
            "name": "py_agent",
            "endpoint": f"http://127.0.0.1:{port}/invoke",
            "ttl_s": 15,
            "status": "ready",
            "capabilities": [
                {
                    "name": os.environ.get("BENCH_CAPABILITY", "test.echo_bare"),
                    "version": "1.0.0",
                }
            ],
        }
        answer = (await http.post(f"{REGISTRY}/v1/agents", json=registration, headers=HEADERS)).json()
        try:
            while True:
                await asyncio.sleep(answer["heartbeat_interval_s"])
                await http.put(
                    f"{REGISTRY}/v1/agents/{AGENT_ID}/heartbeat",
                    json={"lease_id": answer["lease_id"]},
                    headers=HEADERS,
                )
        finally:
            await http.delete(f"{REGISTRY}/v1/agents/{AGENT_ID}", headers=HEADERS)


async def main() -> None:
    # As the SDK binds (and as uvicorn does): IPPROTO_TCP, so asyncio turns Nagle off.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    registered = asyncio.create_task(keep_registered(sock.getsockname()[1]))
    try:
        await server.serve(sockets=[sock])
    finally:
        registered.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registered


if __name__ == "__main__":
    asyncio.run(main())
