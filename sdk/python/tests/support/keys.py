"""Real Ed25519 keys and router-style hop assertions for the tests: a key pair, its JWKS
entry, its PKCS#8 PEM (what the router's ``--assertion-key`` reads) and a signed assertion.

A key's ``kid`` defaults to its RFC 7638 thumbprint, as the router names its keys, so an
assertion a test signs with the stack's router key verifies against the router's own JWKS.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def thumbprint(private: Ed25519PrivateKey) -> str:
    """RFC 7638: base64url(SHA-256 of the JWK's required members, sorted, no whitespace)."""
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    canonical = f'{{"crv":"Ed25519","kty":"OKP","x":"{_b64url(raw)}"}}'
    return _b64url(hashlib.sha256(canonical.encode()).digest())


class SigningKey:
    """An Ed25519 key (fresh unless ``private`` is given) named ``kid`` (default: its thumbprint)."""

    def __init__(self, kid: str | None = None, private: Ed25519PrivateKey | None = None) -> None:
        self.private = private or Ed25519PrivateKey.generate()
        self.kid = kid or thumbprint(self.private)

    def jwk(self) -> dict[str, str]:
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw), "kid": self.kid, "use": "sig", "alg": "EdDSA"}

    def pem(self) -> bytes:
        """PKCS#8 PEM, as `agent-reach keys generate` writes it."""
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def assertion(
        self,
        *,
        audience: str,
        caller: str = "tester",
        capability: str = "test.echo",
        issuer: str = "agent-reach-router",
        ttl_s: int = 30,
        issued_at: int | None = None,
        **extra: Any,
    ) -> str:
        now = int(time.time()) if issued_at is None else issued_at
        claims = {
            "iss": issuer,
            "sub": caller,
            "aud": audience,
            "cap": capability,
            "tenant": "default",
            "iat": now,
            "exp": now + ttl_s,
            **extra,
        }
        return jwt.encode(claims, self.private, algorithm="EdDSA", headers={"kid": self.kid})


def jwks(*keys: SigningKey) -> dict[str, Any]:
    return {"keys": [key.jwk() for key in keys]}
