"""A real OpenID provider on a loopback port: Node's ``oidc-provider`` (OpenID Certified),
run by ``testkit/oidc-provider/provider.mjs`` (the script and the committed lockfile the
Rust tests' ``testkit::oidc`` use; ``scripts/setup.sh`` installs its packages). It issues
JWT access tokens with the client credentials grant for the resource a client names
(RFC 8707), so a test gets tokens exactly as a service would from Keycloak or Okta."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .stack import REPO, Process, _started, find_binary, free_port

PROVIDER_DIR = REPO / "testkit" / "oidc-provider"


@dataclass
class OidcClient:
    """A client of the provider: its tokens' algorithm (RS256, ES256, EdDSA), extra claims."""

    client_id: str
    alg: str = "RS256"
    claims: dict[str, Any] = field(default_factory=dict)

    @property
    def client_secret(self) -> str:
        return f"{self.client_id}-secret"


class OidcProvider:
    """The provider, killed by :meth:`stop`."""

    def __init__(self, directory: Path, clients: list[OidcClient]) -> None:
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
            raise RuntimeError(f"the OpenID provider's packages are missing in {PROVIDER_DIR}: run `scripts/setup.sh`")
        node = find_binary("node", "nodejs")
        specs = [
            {"client_id": c.client_id, "client_secret": c.client_secret, "alg": c.alg, "claims": c.claims}
            for c in clients
        ]
        self.clients = {client.client_id: client for client in clients}
        self.port = 0
        self.process: Process | None = None
        for attempt in range(5):
            self.port = free_port()
            log = directory / f"oidc-provider-{self.port}.log"
            env = {"PORT": str(self.port), "OIDC_CLIENTS": json.dumps(specs)}
            self.process = Process([node, str(PROVIDER_DIR / "provider.mjs")], log, env)
            try:
                _started(self.process, _said_ready(log), "oidc-provider")
                return
            except RuntimeError:
                if attempt == 4:
                    raise

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def token(self, client_id: str, resource: str) -> str:
        """An access token for ``client_id`` whose audience is ``resource``."""
        client = self.clients[client_id]
        response = httpx.post(
            f"{self.issuer}/token",
            data={"grant_type": "client_credentials", "resource": resource},
            auth=(client.client_id, client.client_secret),
            timeout=10,
        )
        response.raise_for_status()
        return str(response.json()["access_token"])

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _said_ready(log: Path) -> Callable[[], bool]:
    """Whether the provider printed `ready` (it listens) in ``log``."""
    return lambda: "ready" in log.read_text().splitlines()
