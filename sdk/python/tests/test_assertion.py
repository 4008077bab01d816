"""The router's hop assertion: verification with real Ed25519 keys, key sources (a real
JWKS endpoint served over HTTP, a JWKS file), refusals by a running agent, and agents
behind the real router: its calls served, everything else refused, key rotations under
load with no failed call."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt as pyjwt
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent_reach import Agent, ConfigError, Ctx, JwksFile, JwksUrl
from agent_reach.assertion import AssertionRefused, Verifier

from .conftest import make_agent
from .support.keys import SigningKey, jwks
from .support.stack import Stack, free_port, wait_until

AUDIENCE = "py_agent-1"


class StaticKeys:
    """A key source holding fixed keys (the JWKS and file sources are tested below)."""

    def __init__(self, *keys: SigningKey) -> None:
        self.keys = {key.kid: key.private.public_key() for key in keys}

    async def start(self, http: httpx.AsyncClient) -> None:
        return None

    def get(self, kid: str) -> Any:
        return self.keys.get(kid)

    async def refresh_for(self, kid: str) -> Any:
        return None

    async def close(self) -> None:
        return None


def refusal(verifier: Verifier, header: str | None) -> str:
    with pytest.raises(AssertionRefused) as refused:
        asyncio.run(verifier.verify(header))
    return refused.value.reason


def test_valid_and_refused_assertions() -> None:
    key, stranger = SigningKey("k1"), SigningKey("k1")  # same kid, different key: a forgery
    verifier = Verifier(StaticKeys(key), audience=AUDIENCE)
    accepted = asyncio.run(verifier.verify(f"Bearer {key.assertion(audience=AUDIENCE, caller='intent_parser')}"))
    assert (accepted.caller, accepted.capability, accepted.tenant) == ("intent_parser", "test.echo", "default")

    assert refusal(verifier, None) == "missing"
    assert refusal(verifier, "Basic abc") == "malformed"
    assert refusal(verifier, "Bearer not-a-jwt") == "malformed"
    assert refusal(verifier, f"Bearer {key.assertion(audience='someone_else-1')}") == "wrong_audience"
    assert (
        refusal(verifier, f"Bearer {key.assertion(audience=AUDIENCE, issued_at=int(time.time()) - 120)}") == "expired"
    )
    assert refusal(verifier, f"Bearer {stranger.assertion(audience=AUDIENCE)}") == "bad_signature"
    assert refusal(verifier, f"Bearer {SigningKey('k9').assertion(audience=AUDIENCE)}") == "unknown_key"
    assert refusal(verifier, f"Bearer {key.assertion(audience=AUDIENCE, issuer='mallory')}") == "wrong_issuer"
    # Tampering with a claim breaks the signature.
    header, claims, signature = key.assertion(audience="other").split(".")
    forged_claims = json.loads(_b64decode(claims))
    forged_claims["aud"] = AUDIENCE
    forged = ".".join([header, _b64encode(json.dumps(forged_claims).encode()), signature])
    assert refusal(verifier, f"Bearer {forged}") == "bad_signature"
    # An HS256 token (what callers present to the router) is never accepted as an assertion.
    hs = pyjwt.encode({"sub": "x", "aud": AUDIENCE, "exp": int(time.time()) + 60}, "s" * 32, algorithm="HS256")
    assert refusal(verifier, f"Bearer {hs}") == "malformed"


def test_expired_assertions_are_refused_even_after_being_cached() -> None:
    key = SigningKey("k1")
    verifier = Verifier(StaticKeys(key), audience=AUDIENCE)
    token = key.assertion(audience=AUDIENCE, ttl_s=10)
    assert asyncio.run(verifier.verify(f"Bearer {token}")).caller == "tester"
    later = time.time() + 60
    with pytest.raises(AssertionRefused) as refused:
        asyncio.run(verifier.verify(f"Bearer {token}", now=later))
    assert refused.value.reason == "expired"


def test_rotation_two_keys_at_once() -> None:
    old, new = SigningKey("2026-11"), SigningKey("2026-12")
    verifier = Verifier(StaticKeys(old, new), audience=AUDIENCE)
    for key in (old, new):
        assert asyncio.run(verifier.verify(f"Bearer {key.assertion(audience=AUDIENCE)}")).caller == "tester"


# === A real JWKS endpoint ===


class JwksServer:
    """Serves a JWKS document over HTTP on loopback (uvicorn in a thread) and counts fetches."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.fetches = 0

        async def jwks_route(request: Request) -> JSONResponse:
            self.fetches += 1
            return JSONResponse(self.document)

        app = Starlette(routes=[Route("/.well-known/jwks.json", jwks_route)])
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_config=None, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10, "the JWKS server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/.well-known/jwks.json"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def jwks_server() -> Iterator[Callable[..., JwksServer]]:
    servers: list[JwksServer] = []

    def start(*keys: SigningKey) -> JwksServer:
        servers.append(JwksServer(jwks(*keys)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_jwks_url_refreshes_on_an_unknown_kid_with_a_rate_limit(jwks_server: Callable[..., JwksServer]) -> None:
    old, new, bogus = SigningKey("old"), SigningKey("new"), SigningKey("bogus")
    server = jwks_server(old)

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            source = JwksUrl(server.url, min_refresh_s=0)
            await source.start(http)
            verifier = Verifier(source, audience=AUDIENCE)
            assert (await verifier.verify(f"Bearer {old.assertion(audience=AUDIENCE)}")).caller == "tester"
            assert server.fetches == 1
            # The router rotates: the new key appears beside the old one.
            server.document = jwks(new, old)
            assert (await verifier.verify(f"Bearer {new.assertion(audience=AUDIENCE)}")).caller == "tester"
            assert server.fetches == 2
            # Unknown kids within the rate limit do not hammer the router.
            source.min_refresh_s = 3600
            for _ in range(5):
                with pytest.raises(AssertionRefused) as refused:
                    await verifier.verify(f"Bearer {bogus.assertion(audience=AUDIENCE)}")
                assert refused.value.reason == "unknown_key"
            assert server.fetches == 2
            # The old key still verifies during the rotation.
            assert (await verifier.verify(f"Bearer {old.assertion(audience=AUDIENCE, caller='b')}")).caller == "b"
            await source.close()

    asyncio.run(scenario())


def test_unknown_kids_share_one_fetch_that_waits_out_the_rate_limit(
    jwks_server: Callable[..., JwksServer],
) -> None:
    """A key the agent never saw, met just after a fetch: the deliveries wait (not fail) for the
    next fetch the rate limit allows, and share it; made-up kids cost one fetch, not one each."""
    old, new = SigningKey(), SigningKey()
    server = jwks_server(old)

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            source = JwksUrl(server.url)  # the defaults: at most one asked-for fetch a second
            await source.start(http)
            verifier = Verifier(source, audience=AUDIENCE)
            server.document = jwks(new, old)
            tokens = [f"Bearer {new.assertion(audience=AUDIENCE, caller=f'c{n}')}" for n in range(10)]
            accepted = await asyncio.gather(*(verifier.verify(token) for token in tokens))
            assert [assertion.caller for assertion in accepted] == [f"c{n}" for n in range(10)]
            assert server.fetches == 2
            bogus = [f"Bearer {SigningKey().assertion(audience=AUDIENCE)}" for _ in range(5)]
            refused = await asyncio.gather(*(verifier.verify(token) for token in bogus), return_exceptions=True)
            assert all(isinstance(error, AssertionRefused) and error.reason == "unknown_key" for error in refused)
            assert server.fetches == 3
            await source.close()

    asyncio.run(scenario())


def test_jwks_url_refreshes_periodically(jwks_server: Callable[..., JwksServer]) -> None:
    first, second = SigningKey("first"), SigningKey("second")
    server = jwks_server(first)

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            source = JwksUrl(server.url, refresh_s=0.05, min_refresh_s=3600)
            await source.start(http)
            server.document = jwks(second)
            deadline = time.monotonic() + 10
            # A bounded poll of a condition, as everywhere in the tests.
            while source.get("second") is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert source.get("second") is not None
            assert source.get("first") is None
            await source.close()

    asyncio.run(scenario())


def test_jwks_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    first, second = SigningKey("first"), SigningKey("second")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(first)))

    async def scenario() -> None:
        source = JwksFile(path, min_refresh_s=0)
        async with httpx.AsyncClient() as http:
            await source.start(http)
        verifier = Verifier(source, audience=AUDIENCE)
        assert (await verifier.verify(f"Bearer {first.assertion(audience=AUDIENCE)}")).caller == "tester"
        path.write_text(json.dumps(jwks(second, first)))
        os.utime(path, (time.time() + 5, time.time() + 5))
        assert (await verifier.verify(f"Bearer {second.assertion(audience=AUDIENCE)}")).caller == "tester"

    asyncio.run(scenario())


def test_bad_jwks_files_fail_clearly(tmp_path: Path) -> None:
    missing = JwksFile(tmp_path / "none.json")
    with pytest.raises(ValueError, match="cannot read the JWKS file"):
        missing.load()
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        JwksFile(tmp_path / "bad.json").load()
    (tmp_path / "empty.json").write_text('{"keys": [{"kty": "RSA", "kid": "r"}]}')
    with pytest.raises(ValueError, match="holds no Ed25519 signing key"):
        JwksFile(tmp_path / "empty.json").load()
    (tmp_path / "notjwks.json").write_text("[]")
    with pytest.raises(ValueError, match="is not a JWKS document"):
        JwksFile(tmp_path / "notjwks.json").load()


# === A running agent with verification on ===


def test_a_running_agent_refuses_forged_and_mismatched_deliveries(
    stack: Stack, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    key = SigningKey("router-1")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(key)))
    agent = make_agent(stack, agent_id="py_agent-verified", jwks_file=path)

    @agent.handler("test.echo")
    async def echo(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        return {"source": ctx.source, "tenant": ctx.tenant}

    start_agent(agent)
    address = agent.local_address
    assert address is not None

    def deliver(authorization: str | None, source: str = "tester", capability: str = "test.echo") -> httpx.Response:
        envelope = {
            "version": "1.0",
            "request_id": f"r-{time.monotonic_ns()}",
            "capability": capability,
            "capability_version": "1.0.0",
            "source": source,
            "priority": "normal",
            "deadline": int(time.time() * 1000) + 10_000,
            "attempt": 1,
            "payload": {},
        }
        headers = {"authorization": authorization} if authorization else {}
        return httpx.post(f"http://{address[0]}:{address[1]}/invoke", json=envelope, headers=headers)

    def reason(response: httpx.Response) -> str:
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert error["code"] == "UNAUTHENTICATED"
        return str(error["details"]["reason"])

    good = key.assertion(audience=agent.agent_id)
    ok = deliver(f"Bearer {good}")
    assert ok.status_code == 200, ok.text
    assert ok.json()["output"] == {"source": "tester", "tenant": "default"}
    assert reason(deliver(None)) == "missing"
    assert reason(deliver(f"Bearer {key.assertion(audience='someone_else-1')}")) == "wrong_audience"
    assert (
        reason(deliver(f"Bearer {key.assertion(audience=agent.agent_id, issued_at=int(time.time()) - 120)}"))
        == "expired"
    )
    assert reason(deliver(f"Bearer {SigningKey('router-1').assertion(audience=agent.agent_id)}")) == "bad_signature"
    # A forged envelope: a real assertion for `tester`, the envelope claiming someone else.
    assert reason(deliver(f"Bearer {good}", source="order_query")) == "source_mismatch"
    assert reason(deliver(f"Bearer {good}", capability="test.other")) == "capability_mismatch"


def test_verification_is_on_by_default_and_the_switch_warns(
    stack: Stack, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent("py_agent", registry=stack.registry.url, token=stack.token("py_agent"))

    @agent.handler("test.echo")
    def echo(payload: str) -> str:
        return payload

    with pytest.raises(ConfigError, match="verifying the router's assertions needs its keys"):
        agent.start(handle_signals=False)

    monkeypatch.setenv("AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED", "1")
    switched = Agent("py_agent", registry=stack.registry.url, token=stack.token("py_agent"))
    switched.handler("test.echo")(echo)
    assert switched.insecure_accept_unverified
    switched.start(handle_signals=False)
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("ROUTER ASSERTIONS ARE NOT VERIFIED" in message for message in warnings)
    finally:
        switched.stop(timeout_s=30)


def _b64decode(text: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64encode(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# === Behind the real router: its own keys, its own assertions ===


class Recorded:
    """An agent served (``agent.serve``, in a thread) through an ASGI wrapper that keeps the
    assertion the router put on each delivery, before the agent checks it."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.assertions: list[str] = []

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/invoke":
                header = dict(scope["headers"]).get(b"authorization", b"").decode()
                self.assertions.append(header.removeprefix("Bearer "))
            await agent.asgi(scope, receive, send)

        self.thread = threading.Thread(target=lambda: asyncio.run(agent.serve(app)), daemon=True)
        self.thread.start()

    def kids(self) -> list[str]:
        return [str(pyjwt.get_unverified_header(token)["kid"]) for token in list(self.assertions) if token]

    def stop(self) -> None:
        self.agent.request_stop()
        self.thread.join(30)


@pytest.fixture
def serve_recorded(stack: Stack) -> Iterator[Callable[[Agent], Recorded]]:
    """Serves an agent with its deliveries recorded, waits until the registry resolves it, stops it after."""
    served: list[Recorded] = []

    def serve(agent: Agent) -> Recorded:
        served.append(Recorded(agent))
        capability = agent.handlers[0].descriptor.capability
        wait_until(lambda: stack.routable(capability, agent.agent_id), 20, f"{agent.agent_id} routable")
        return served[-1]

    yield serve
    for recorded in served:
        recorded.stop()


def direct_envelope(capability: str, source: str = "tester") -> dict[str, Any]:
    return {
        "version": "1.0",
        "request_id": f"direct-{time.monotonic_ns()}",
        "capability": capability,
        "capability_version": "1.0.0",
        "source": source,
        "priority": "normal",
        "deadline": int(time.time() * 1000) + 10_000,
        "attempt": 1,
        "payload": {},
    }


def refusal_reason(response: httpx.Response) -> str:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "UNAUTHENTICATED"
    return str(error["details"]["reason"])


def test_behind_the_router_calls_are_served_and_anything_else_is_refused(
    stack: Stack,
    start_agent: Callable[..., Agent],
    serve_recorded: Callable[[Agent], Recorded],
    invoke: Callable[..., httpx.Response],
) -> None:
    guarded = make_agent(stack, agent_id="py_agent-guarded")

    @guarded.handler("test.guarded")
    async def serve_guarded(payload: dict[str, Any], ctx: Ctx) -> dict[str, Any]:
        return {"source": ctx.source, "tenant": ctx.tenant}

    start_agent(guarded)
    # Another agent, whose deliveries show what the router sends it.
    neighbour = make_agent(stack, agent_id="py_agent-neighbour")

    @neighbour.handler("test.neighbour")
    async def serve_neighbour(payload: dict[str, Any]) -> dict[str, Any]:
        return {}

    recorded = serve_recorded(neighbour)

    # The router's calls: verified against the router's own JWKS, `source` the verified caller.
    answer = invoke("test.guarded", {})
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"] == {"source": "tester", "tenant": "default"}
    assert invoke("test.neighbour", {}).status_code == 200
    (stolen,) = recorded.assertions
    assert recorded.kids() == [stack.router_key.kid]

    address = guarded.local_address
    assert address is not None
    url = f"http://{address[0]}:{address[1]}/invoke"
    # A forged envelope posted straight to the agent, as anyone who can reach it could.
    forged = httpx.post(url, json=direct_envelope("test.guarded", source="intent_parser"))
    assert refusal_reason(forged) == "missing"
    # The assertion the router issued to the neighbour, replayed against this agent.
    replayed = httpx.post(url, json=direct_envelope("test.neighbour"), headers={"authorization": f"Bearer {stolen}"})
    assert refusal_reason(replayed) == "wrong_audience"
    # Signed with the router's real key, for this agent, but expired.
    expired = stack.assertion(audience=guarded.agent_id, capability="test.guarded", issued_at=int(time.time()) - 120)
    late = httpx.post(url, json=direct_envelope("test.guarded"), headers={"authorization": f"Bearer {expired}"})
    assert refusal_reason(late) == "expired"
    # The same key and claims, unexpired, are served: the refusals above are about the assertion alone.
    fresh = stack.assertion(audience=guarded.agent_id, capability="test.guarded")
    served = httpx.post(url, json=direct_envelope("test.guarded"), headers={"authorization": f"Bearer {fresh}"})
    assert served.status_code == 200, served.text


def router_kids(router: Any) -> list[str]:
    return [key["kid"] for key in httpx.get(f"{router.url}/.well-known/jwks.json", timeout=5).json()["keys"]]


def write_atomically(path: Path, data: bytes) -> None:
    """Replaces a key file in one step, as a Kubernetes secret update does (the router never reads half a key)."""
    staged = path.with_suffix(".staged")
    staged.write_bytes(data)
    os.replace(staged, path)


def rotate_under_load(
    stack: Stack,
    serve_recorded: Callable[[Agent], Recorded],
    directory: Path,
    *,
    start_keys: tuple[SigningKey, SigningKey],
    rotate: Callable[[], None],
    signing_after: SigningKey,
    published_after: list[str],
) -> None:
    """Starts a router signing with ``start_keys[0]`` and publishing ``start_keys[1]``, calls a
    Python agent behind it from 4 threads, rotates, keeps calling for at least 3 s of assertions
    signed by ``signing_after``, and checks that no call failed."""
    signing, published = directory / "signing.pem", directory / "next.pem"
    signing.write_bytes(start_keys[0].pem())
    published.write_bytes(start_keys[1].pem())
    router = stack.start_router(["--assertion-key", str(signing), "--assertion-published-key", str(published)])
    try:
        assert router_kids(router) == [start_keys[0].kid, start_keys[1].kid]
        agent = make_agent(stack, agent_id=f"py_agent-rotation-{os.urandom(2).hex()}", router=router.url)
        capability = f"test.rotation.r{os.urandom(3).hex()}"

        @agent.handler(capability)
        async def rotation(payload: dict[str, Any]) -> dict[str, str]:
            return {"agent_id": agent.agent_id}

        recorded = serve_recorded(agent)
        headers = {"authorization": f"Bearer {stack.token('tester')}"}
        body = {"capability": capability, "payload": {}}

        def call(client: httpx.Client) -> httpx.Response:
            return client.post(f"{router.url}/v1/invoke", json=body, headers=headers)

        with httpx.Client(timeout=30) as client:
            # This router's snapshot may lag the registry by a moment.
            wait_until(lambda: call(client).status_code == 200, 20, "the rotation router routing to the agent")
        served: list[int] = []
        failures: list[str] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=30) as client:
                # Bounded: at most 5,000 calls per thread; the test stops it sooner.
                for _ in range(5000):
                    if stop.is_set():
                        return
                    answer = call(client)
                    if answer.status_code == 200 and answer.json()["output"] == {"agent_id": agent.agent_id}:
                        served.append(1)
                    else:
                        failures.append(f"{answer.status_code} {answer.text}")

        callers = [threading.Thread(target=load) for _ in range(4)]
        for caller in callers:
            caller.start()
        try:
            wait_until(lambda: len(served) >= 50, 30, "steady calls before the rotation")
            rotate()
            rotated_at = time.monotonic()
            # The router polls its key files every second.
            wait_until(lambda: router_kids(router) == [signing_after.kid, *published_after], 10, "the new JWKS")
            wait_until(
                lambda: time.monotonic() - rotated_at >= 3 and recorded.kids().count(signing_after.kid) >= 50,
                30,
                "3 s of calls signed with the new key",
            )
        finally:
            stop.set()
            for caller in callers:
                caller.join(30)
        assert failures == [], failures[:3]
        kids = recorded.kids()
        assert kids[0] == start_keys[0].kid
        assert kids[-1] == signing_after.kid
        # Once switched, the router never went back to the old key.
        switched = kids.index(signing_after.kid)
        assert set(kids[switched:]) == {signing_after.kid}
    finally:
        router.stop()


def test_key_rotation_under_load_with_zero_failed_calls(
    stack: Stack, serve_recorded: Callable[[Agent], Recorded], tmp_path: Path
) -> None:
    """The documented rotation: the next key is published first, then the two files swap."""
    current, upcoming = SigningKey(), SigningKey()

    def swap() -> None:
        write_atomically(tmp_path / "signing.pem", upcoming.pem())
        write_atomically(tmp_path / "next.pem", current.pem())

    rotate_under_load(
        stack,
        serve_recorded,
        tmp_path,
        start_keys=(current, upcoming),
        rotate=swap,
        signing_after=upcoming,
        published_after=[current.kid],
    )


def test_a_signing_key_the_agent_never_saw_costs_no_call(
    stack: Stack, serve_recorded: Callable[[Agent], Recorded], tmp_path: Path
) -> None:
    """A direct swap to a brand-new key: the agent meets an unknown `kid` and refreshes at once."""
    current, other, brand_new = SigningKey(), SigningKey(), SigningKey()
    rotate_under_load(
        stack,
        serve_recorded,
        tmp_path,
        start_keys=(current, other),
        rotate=lambda: write_atomically(tmp_path / "signing.pem", brand_new.pem()),
        signing_after=brand_new,
        published_after=[other.kid],
    )
