"""TLS on every link of a Python agent and caller (issue 20; the Rust SDK's ``sdk/tests/tls.rs``):
the registry, router and context service serve https only with certificates from a CA made for
the test; the agent registers, fetches the router's keys and patches contexts over https, and a
client calls through the router, all trusting only that CA (``ca_file=``). Without it, or with
another CA, verification (on by default) refuses the services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach import Agent, Client, ConfigError, Ctx
from agent_reach.errors import TransportError

from .conftest import make_agent
from .support.pki import Pki
from .support.stack import Service, Stack, wait_until


class TlsServices:
    def __init__(self, stack: Stack, directory: Path) -> None:
        self.pki = Pki(directory)
        self.parts: list[Service] = []
        try:
            registry = self.pki.server("registry")
            self.registry = self._keep(
                stack.start_registry(tls=(registry.cert, registry.key), ca_file=self.pki.ca_file)
            )
            context = self.pki.server("context")
            self.context = self._keep(
                Service(
                    "context",
                    ["--redis", stack.redis.url, *stack.auth],
                    stack.directory,
                    tls=(context.cert, context.key),
                    ca_file=self.pki.ca_file,
                )
            )
            router = self.pki.server("router")
            router_args = ["--registry", self.registry.url, "--registry-ca-file", str(self.pki.ca_file)]
            router_args += ["--assertion-key", str(stack.directory / "assertion.pem")]
            self.router = self._keep(
                Service(
                    "router",
                    [*router_args, *stack.auth],
                    stack.directory,
                    tls=(router.cert, router.key),
                    ca_file=self.pki.ca_file,
                )
            )
        except BaseException:
            self.stop()
            raise

    def _keep(self, service: Service) -> Service:
        self.parts.append(service)
        return service

    def stop(self) -> None:
        for part in reversed(self.parts):
            part.stop()


@pytest.fixture(scope="module")
def tls(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServices]:
    services = TlsServices(stack, tmp_path_factory.mktemp("pki"))
    try:
        yield services
    finally:
        services.stop()


def tls_agent(stack: Stack, tls: TlsServices, agent_id: str, **options: Any) -> Agent:
    settings: dict[str, Any] = {
        "agent_id": agent_id,
        "registry": tls.registry.url,
        "router": tls.router.url,
        "context": tls.context.url,
        "ca_file": tls.pki.ca_file,
    }
    settings.update(options)
    return make_agent(stack, **settings)


def routable(tls: TlsServices, stack: Stack, agent_id: str) -> bool:
    answer = httpx.get(
        f"{tls.registry.url}/v1/capabilities/test.tls.echo",
        headers={"authorization": f"Bearer {stack.token('tester')}"},
        verify=tls.registry.verify,
    )
    if answer.status_code != 200 or not any(i["agent_id"] == agent_id for i in answer.json()["instances"]):
        return False
    # The router learns of an instance a moment after the registry (longer on a loaded
    # machine): its snapshot holds it once /metrics publishes the instance's gauge.
    metrics = httpx.get(f"{tls.router.url}/metrics", timeout=5, verify=tls.router.verify)
    return f'agent_reach_router_instance_health_score{{agent_id="{agent_id}"}}' in metrics.text


def test_an_agent_and_a_client_work_over_https_trusting_only_the_ca_file(
    stack: Stack, tls: TlsServices, start_agent: Callable[..., Agent]
) -> None:
    agent = tls_agent(stack, tls, "py_agent-tls")

    @agent.handler("test.tls.echo")
    async def echo(payload: dict[str, str], ctx: Ctx) -> dict[str, str]:
        # The context service over https, through the agent's own client.
        await ctx.context.patch(set={"seen": payload["text"]})
        return {"text": payload["text"]}

    agent.start(handle_signals=False)
    try:
        agent.mark_ready()
        wait_until(lambda: routable(tls, stack, agent.agent_id), 10, "the agent registered over https")
        with Client(
            router=tls.router.url, context=tls.context.url, token=stack.token("tester"), ca_file=tls.pki.ca_file
        ) as client:
            created = client.create_context({"seen": "nothing yet"})
            # The router verifies the agent's call with its own keys, which the agent fetched
            # from the router's https JWKS.
            result = client.invoke("test.tls.echo", {"text": "over tls"}, context_id=created.context_id)
            assert result.output == {"text": "over tls"}
            assert client.get_context(created.context_id).fields["seen"] == "over tls"
    finally:
        agent.stop(timeout_s=30)


def test_verification_is_on_by_default_and_trusts_only_the_given_ca(
    stack: Stack, tls: TlsServices, tmp_path: Path
) -> None:
    # No ca_file: the system's roots, which do not hold the test CA.
    with Client(router=tls.router.url, token=stack.token("tester")) as client, pytest.raises(TransportError) as refused:
        client.invoke("test.tls.echo", {"text": "x"})
    assert refused.value.code == "ROUTER_UNREACHABLE"
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    # Another CA's file: only its CAs are trusted, so the services' certificates are not.
    other = Pki(tmp_path / "other", name="another CA")
    with (
        Client(router=tls.router.url, token=stack.token("tester"), ca_file=other.ca_file) as client,
        pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.invoke("test.tls.echo", {"text": "x"})


def test_a_ca_file_that_is_missing_or_not_pem_is_a_config_error(stack: Stack, tmp_path: Path) -> None:
    missing, junk = tmp_path / "missing.pem", tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"ca_file .*missing\.pem: cannot read it"):
        Client(router="https://127.0.0.1:1", token="t", ca_file=missing)
    with pytest.raises(ConfigError, match=r"ca_file .*junk\.pem holds no PEM certificate"):
        Client(router="https://127.0.0.1:1", token="t", ca_file=junk)
    with pytest.raises(ConfigError, match="pass ca_file= or http="):
        Client(router="https://127.0.0.1:1", token="t", ca_file=junk, http=httpx.Client())
    agent = make_agent(stack, ca_file=junk)

    @agent.handler("test.tls.echo")
    def echo(payload: dict[str, str]) -> dict[str, str]:
        return payload

    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        agent.start(handle_signals=False)


def test_the_ca_file_comes_from_the_environment(
    stack: Stack, tls: TlsServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_REACH_CA_FILE", str(tls.pki.ca_file))
    with Client(router=tls.router.url, token=stack.token("tester")) as client:
        # Trusted now: the router answers (no agent serves this capability).
        answer = client._http.get(f"{tls.router.url}/readyz")
        assert answer.status_code == 200
