"""Real Ed25519 keys and router-style hop assertions for the tests (the router does not
sign yet, issue 20): a key pair, its JWKS entry, and a signed assertion."""

from __future__ import annotations

import base64
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


class SigningKey:
    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.private = Ed25519PrivateKey.generate()

    def jwk(self) -> dict[str, str]:
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": self.kid, "use": "sig", "alg": "EdDSA"}

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
