"""The router's hop assertion (DESIGN §8): every forwarded call carries
``Authorization: Bearer <JWT>`` signed by the router with Ed25519 (``alg: EdDSA``),
claims ``iss`` (the router's issuer name), ``sub`` (the verified caller), ``aud`` (the
target ``agent_id``), ``cap`` (the capability), ``tenant``, ``iat`` and ``exp``.

An agent refuses a call whose assertion is missing or invalid with 401
``UNAUTHENTICATED`` and a ``reason``: ``missing``, ``malformed``, ``unknown_key``,
``bad_signature``, ``wrong_issuer``, ``wrong_audience``, ``expired``, and, checked
against the envelope, ``source_mismatch`` (``source`` is not the assertion's ``sub``)
and ``capability_mismatch`` (``capability`` is not its ``cap``).

Public keys come from the router's JWKS (``GET {router}/.well-known/jwks.json``, RFC
7517; during a rotation it lists the current and the next or previous key): fetched at
start, every minute and, rate-limited, whenever a token names an unknown ``kid`` (the
same schedule as the Rust SDK, ``sdk/src/verify.rs``). Or from a JWKS file, read again
when it changes on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .logs import logger

DEFAULT_ISSUER = "agent-reach-router"
#: Seconds of clock skew tolerated on ``exp``, ``iat`` (as the services tolerate on tokens).
LEEWAY_S = 5
INSECURE_ENV = "AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED"


class AssertionRefused(Exception):
    """A delivery's assertion is not acceptable; ``reason`` is the short label answered."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Assertion:
    """The verified claims of one assertion."""

    issuer: str
    caller: str
    audience: str
    capability: str
    tenant: str
    expires_at: int
    #: The assertion itself: a handler's calls onwards present it upstream
    #: (``agent-reach-upstream``), so the router carries the delegation chain on.
    token: str = ""
    #: The delegation chain the router vouches for: the original subject first, each
    #: agent it passed through, the immediate caller last (DESIGN §9 ``act``).
    chain: tuple[str, ...] = ()


def parse_jwks(document: Any, origin: str) -> dict[str, Ed25519PublicKey]:
    """The Ed25519 keys of a JWKS document by ``kid``; keys of other types are skipped.

    Raises ``ValueError`` naming ``origin`` when the document is not a JWKS at all.
    """
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError(f'{origin} is not a JWKS document (expected {{"keys": [...]}})')
    keys: dict[str, Ed25519PublicKey] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
            continue
        if entry.get("use", "sig") != "sig" or not isinstance(entry.get("kid"), str):
            continue
        try:
            key = jwt.PyJWK(entry, algorithm="EdDSA").key
        except (jwt.PyJWKError, ValueError, TypeError) as error:
            raise ValueError(f"{origin}: key `{entry.get('kid')}` is not a valid Ed25519 JWK: {error}") from error
        if isinstance(key, Ed25519PublicKey):
            keys[entry["kid"]] = key
    return keys


class KeySource(Protocol):
    """Where verification keys come from."""

    async def start(self, http: httpx.AsyncClient) -> None: ...

    def get(self, kid: str) -> Ed25519PublicKey | None: ...

    async def refresh_for(self, kid: str) -> Ed25519PublicKey | None:
        """Tries to learn ``kid`` (rate-limited); the key, or None."""
        ...

    async def close(self) -> None: ...


class JwksUrl:
    """Keys from a router's JWKS endpoint, cached; fetched again every ``refresh_s`` and
    when a token names a key not in the cache (a rotation), as the Rust SDK does.

    An unknown ``kid`` asks for a fetch at most once per ``min_refresh_s``; every delivery
    asking meanwhile shares that fetch and waits at most ``refresh_wait_s`` for it, so a
    rotation costs no call and a flood of made-up ``kid``s costs the router one fetch a
    second."""

    def __init__(
        self, url: str, *, refresh_s: float = 60.0, min_refresh_s: float = 1.0, refresh_wait_s: float = 2.0
    ) -> None:
        self.url = url
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self.refresh_wait_s = refresh_wait_s
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._http: httpx.AsyncClient | None = None
        self._last_fetch = -float("inf")
        self._lock = asyncio.Lock()
        self._periodic: asyncio.Task[None] | None = None
        #: The fetch deliveries asked for that has not begun yet (it waits out ``min_refresh_s``).
        self._asked: asyncio.Task[None] | None = None
        #: Strong references to the fetches asked for (the event loop keeps only weak ones).
        self._fetches: set[asyncio.Task[None]] = set()

    async def start(self, http: httpx.AsyncClient) -> None:
        self._http = http
        async with self._lock:
            await self._fetch()
        self._periodic = asyncio.create_task(self._refresh_periodically(), name="agent_reach.jwks")

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self._keys.get(kid)

    async def refresh_for(self, kid: str) -> Ed25519PublicKey | None:
        if kid in self._keys:
            return self._keys[kid]
        if self._asked is None:
            gap = self._last_fetch + self.min_refresh_s - time.monotonic()
            if gap > self.refresh_wait_s:
                # The next fetch allowed is further away than a delivery may wait.
                return None
            self._asked = asyncio.create_task(self._fetch_after(gap), name="agent_reach.jwks.asked")
            self._fetches.add(self._asked)
            self._asked.add_done_callback(self._fetches.discard)
        # Shielded: a delivery giving up does not cancel the fetch others wait for.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._asked), self.refresh_wait_s)
        return self._keys.get(kid)

    async def close(self) -> None:
        for task in (self._periodic, *self._fetches):
            if task is not None:
                task.cancel()

    async def _fetch_after(self, gap: float) -> None:
        if gap > 0:
            await asyncio.sleep(gap)
        # From here on a delivery asking gets a fetch of its own: this one may begin before
        # its key is published.
        self._asked = None
        async with self._lock:
            await self._fetch()

    async def _fetch(self) -> None:
        assert self._http is not None, "start() first"
        self._last_fetch = time.monotonic()
        try:
            response = await self._http.get(self.url, timeout=5.0)
            response.raise_for_status()
            keys = parse_jwks(response.json(), self.url)
        except (httpx.HTTPError, ValueError) as error:
            # Keep the keys we have: a router restart must not make every call fail.
            logger.warning(
                "Cannot fetch the router's JWKS; keeping %d known key(s).",
                len(self._keys),
                extra={"url": self.url, "error": str(error)},
            )
            return
        if set(keys) != set(self._keys):
            logger.info("Router keys loaded.", extra={"url": self.url, "kids": ",".join(sorted(keys))})
        self._keys = keys

    async def _refresh_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            async with self._lock:
                await self._fetch()


class JwksFile:
    """Keys from a JWKS file, read at start and again when its modification time changes."""

    def __init__(self, path: str | os.PathLike[str], *, min_refresh_s: float = 1.0) -> None:
        self.path = os.fspath(path)
        self.min_refresh_s = min_refresh_s
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._mtime: float | None = None
        self._last_check = -float("inf")

    def load(self) -> None:
        """Reads the file; raises ``ValueError`` naming the file and the problem."""
        try:
            with open(self.path, encoding="utf-8") as file:
                stat = os.fstat(file.fileno())
                document = json.load(file)
        except OSError as error:
            raise ValueError(f"cannot read the JWKS file {self.path}: {error.strerror}") from error
        except json.JSONDecodeError as error:
            raise ValueError(f"the JWKS file {self.path} is not JSON: {error}") from error
        keys = parse_jwks(document, self.path)
        if not keys:
            raise ValueError(f"the JWKS file {self.path} holds no Ed25519 signing key (kty OKP, crv Ed25519, kid)")
        self._keys, self._mtime = keys, stat.st_mtime

    async def start(self, http: httpx.AsyncClient) -> None:
        self.load()

    def get(self, kid: str) -> Ed25519PublicKey | None:
        return self._keys.get(kid)

    async def refresh_for(self, kid: str) -> Ed25519PublicKey | None:
        now = time.monotonic()
        if now - self._last_check >= self.min_refresh_s:
            self._last_check = now
            try:
                if os.stat(self.path).st_mtime != self._mtime:
                    self.load()
            except (OSError, ValueError) as error:
                logger.warning(
                    "Cannot reload the JWKS file; keeping the keys loaded.",
                    extra={"path": self.path, "error": str(error)},
                )
        return self._keys.get(kid)

    async def close(self) -> None:
        return None


class Verifier:
    """Checks assertions for one agent instance (``audience``), with a small cache of
    verified tokens: the router reuses an assertion for a (caller, agent) pair until
    near its expiry, so most deliveries skip the signature check."""

    _CACHE_SIZE = 1024

    def __init__(self, source: KeySource, *, audience: str, issuer: str = DEFAULT_ISSUER) -> None:
        self.source = source
        self.audience = audience
        self.issuer = issuer
        self._verified: OrderedDict[str, Assertion] = OrderedDict()

    async def verify(self, authorization: str | None, now: float | None = None) -> Assertion:
        """The assertion in an ``Authorization`` header value, or :class:`AssertionRefused`."""
        if not authorization:
            raise AssertionRefused("missing", "missing router assertion: expected `Authorization: Bearer <JWT>`")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AssertionRefused("malformed", "the Authorization header is not `Bearer <JWT>`")
        moment = time.time() if now is None else now
        cached = self._verified.get(token)
        if cached is not None:
            if cached.expires_at + LEEWAY_S > moment:
                return cached
            del self._verified[token]
        assertion = await self._verify(token, moment)
        self._verified[token] = assertion
        if len(self._verified) > self._CACHE_SIZE:
            self._verified.popitem(last=False)
        return assertion

    async def _verify(self, token: str, now: float) -> Assertion:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as error:
            raise AssertionRefused("malformed", f"the assertion is not a JWT: {error}") from error
        if header.get("alg") != "EdDSA":
            raise AssertionRefused("malformed", f"the assertion's alg is {header.get('alg')!r}; only EdDSA is accepted")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AssertionRefused("malformed", "the assertion names no key (`kid` header)")
        key = self.source.get(kid) or await self.source.refresh_for(kid)
        if key is None:
            raise AssertionRefused(
                "unknown_key", f"the assertion is signed with key `{kid}`, which the router's keys do not list"
            )
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["EdDSA"],
                options={
                    "require": ["iss", "sub", "aud", "exp", "iat"],
                    "verify_aud": False,
                    "verify_iss": False,
                    "verify_exp": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidSignatureError as error:
            raise AssertionRefused(
                "bad_signature", "the assertion's signature does not verify with the router's key"
            ) from error
        except jwt.MissingRequiredClaimError as error:
            raise AssertionRefused("malformed", f"the assertion lacks the `{error.claim}` claim") from error
        except jwt.InvalidTokenError as error:
            raise AssertionRefused("malformed", f"the assertion cannot be decoded: {error}") from error
        # Checked here rather than by PyJWT, so each failure gets its own reason.
        if claims["iss"] != self.issuer:
            raise AssertionRefused(
                "wrong_issuer", f"the assertion was issued by {claims['iss']!r}, not {self.issuer!r}"
            )
        audience = claims["aud"]
        audiences = audience if isinstance(audience, list) else [audience]
        if self.audience not in audiences:
            raise AssertionRefused(
                "wrong_audience", f"the assertion is for {audience!r}, not for this agent ({self.audience!r})"
            )
        exp = claims["exp"]
        if not isinstance(exp, (int, float)) or not isinstance(claims["iat"], (int, float)):
            raise AssertionRefused("malformed", "the assertion's `exp` and `iat` must be numbers")
        if exp + LEEWAY_S <= now:
            raise AssertionRefused("expired", "the assertion has expired")
        if claims["iat"] - LEEWAY_S > now:
            raise AssertionRefused("malformed", "the assertion was issued in the future (check the clocks)")
        caller, capability = claims["sub"], claims.get("cap")
        if not isinstance(caller, str) or not isinstance(capability, str):
            raise AssertionRefused("malformed", "the assertion needs string `sub` and `cap` claims")
        tenant = claims.get("tenant", "default")
        return Assertion(
            issuer=str(claims["iss"]),
            caller=caller,
            audience=self.audience,
            capability=capability,
            tenant=tenant if isinstance(tenant, str) else "default",
            expires_at=int(exp),
            token=token,
            chain=chain_of(claims.get("act"), caller),
        )


def chain_of(act: Any, caller: str) -> tuple[str, ...]:
    """The names of an RFC 8693 ``act`` nesting (latest hop outermost), original subject
    first, then ``caller``; a malformed nesting counts as none."""
    names: list[str] = []
    while isinstance(act, dict) and isinstance(act.get("sub"), str):
        names.append(act["sub"])
        act = act.get("act")
    names.reverse()
    names.append(caller)
    return tuple(names)


def insecure_from_env() -> bool:
    """Whether ``AGENT_REACH_INSECURE_ACCEPT_UNVERIFIED`` asks to accept unverified calls."""
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
