"""OIDC issuers (issue 39, DESIGN §5.3.1) as an MCP client meets them: a router that
accepts a real OpenID provider's tokens (Node's ``oidc-provider``, on loopback) refuses an
anonymous MCP request with ``WWW-Authenticate: Bearer resource_metadata="…"`` (RFC 9728
§5.1); the official ``mcp`` client's auth helpers read that pointer and the protected
resource metadata it leads to, and its ``ClientCredentialsOAuthProvider`` follows them to
the provider, gets a token for the router (RFC 8707 ``resource``) and calls a tool, with
nothing configured but the MCP URL, the client's credentials and the issuer it trusts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import httpx2
import pytest
from mcp.client import Client
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.auth.utils import (
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    handle_protected_resource_response,
)
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import BaseModel

from agent_reach import Agent

from .conftest import make_agent
from .support.oidc import OidcClient, OidcProvider
from .support.stack import Service, Stack, free_port, wait_until

#: The provider's client for the MCP client; its tokens name the agent `tester` in
#: `agent_name`, the claim the router maps to the caller (`svc-mcp` is unknown to the ACL).
CLIENT = OidcClient("svc-mcp", alg="ES256", claims={"agent_name": "tester", "groups": ["support"]})


class Order(BaseModel):
    order_id: str


class Priced(BaseModel):
    order_id: str
    total_cents: int


class Memory(TokenStorage):
    """Tokens and client information kept in memory (the client's own storage)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.fixture(scope="module")
def provider(stack: Stack) -> Iterator[OidcProvider]:
    started = OidcProvider(stack.directory, [CLIENT])
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def oidc_router(stack: Stack, provider: OidcProvider) -> Iterator[Service]:
    """A router on the stack's registry accepting the provider's tokens for its own URL,
    beside the stack's HS256 secret."""
    port = free_port()
    args = ["--registry", stack.registry.url, "--assertion-key", str(stack.directory / "assertion.pem")]
    args += ["--auth-oidc-issuer", provider.issuer, "--auth-oidc-audience", f"http://127.0.0.1:{port}"]
    args += ["--auth-claim-name", "agent_name", *stack.auth]
    router = Service("router", args, stack.directory, port=port)
    try:
        # The router fetches the provider's keys in the background, once, at start-up: until
        # then its tokens are refused as `unknown_key`.
        token = provider.token(CLIENT.client_id, router.url)
        wait_until(lambda: invoke(router, token).status_code != 401, 20, "the router has the provider's keys")
        yield router
    finally:
        router.stop()


def pricing_agent(stack: Stack) -> Agent:
    agent = make_agent(stack)

    @agent.handler("test.oidc_price", version="1.0.0")
    async def price(payload: Order) -> Priced:
        """Price an order."""
        return Priced(order_id=payload.order_id, total_cents=250)

    return agent


def test_the_mcp_clients_auth_helpers_read_the_protected_resource_metadata(
    oidc_router: Service, provider: OidcProvider
) -> None:
    mcp_url = f"{oidc_router.url}/mcp"
    refused = httpx2.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=10)
    assert refused.status_code == 401
    pointer = extract_resource_metadata_from_www_auth(refused)
    assert pointer == f"{oidc_router.url}/.well-known/oauth-protected-resource"
    # The client tries the pointer first, then the well-known URLs (SEP-985).
    urls = build_protected_resource_metadata_discovery_urls(pointer, mcp_url)
    assert urls[0] == pointer

    async def discover() -> None:
        async with httpx2.AsyncClient() as client:
            metadata = await handle_protected_resource_response(await client.get(urls[0]))
        assert metadata is not None
        assert str(metadata.resource) == oidc_router.url
        assert [str(server) for server in metadata.authorization_servers] == [provider.issuer]
        assert metadata.bearer_methods_supported == ["header"]

    asyncio.run(discover())
    # The router's own URL is the audience its tokens must name; another is refused.
    elsewhere = provider.token(CLIENT.client_id, "https://billing.example.com")
    answer = invoke(oidc_router, elsewhere)
    assert answer.status_code == 401
    assert answer.json()["error"]["details"]["reason"] == "wrong_audience"


def test_an_mcp_client_with_client_credentials_finds_the_issuer_and_calls_a_tool(
    stack: Stack, start_agent: Callable[..., Agent], oidc_router: Service, provider: OidcProvider
) -> None:
    agent = start_agent(pricing_agent(stack))
    wait_until(
        lambda: f'agent_id="{agent.agent_id}"' in httpx.get(f"{oidc_router.url}/metrics", timeout=5).text,
        20,
        "the OIDC router routes the agent",
    )
    storage = Memory()
    auth = ClientCredentialsOAuthProvider(
        server_url=f"{oidc_router.url}/mcp",
        storage=storage,
        client_id=CLIENT.client_id,
        client_secret=CLIENT.client_secret,
        issuer=provider.issuer,
    )

    async def call() -> None:
        http = create_mcp_http_client(auth=auth)
        async with Client(streamable_http_client(f"{oidc_router.url}/mcp", http_client=http)) as mcp:
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            assert "test.oidc_price" in names, names
            result = await mcp.call_tool("test.oidc_price", {"order_id": "SO-1"})
            assert not result.is_error, result
            assert result.structured_content == {"order_id": "SO-1", "total_cents": 250}

    asyncio.run(call())
    # The client got its token from the provider, for the router (RFC 8707 `resource`).
    assert storage.tokens is not None
    answer = invoke(oidc_router, storage.tokens.access_token)
    assert answer.status_code == 200, answer.text


def invoke(router: Service, token: str) -> httpx.Response:
    return httpx.post(
        f"{router.url}/v1/invoke",
        json={"capability": "test.oidc_price", "payload": {"order_id": "SO-2"}},
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )
