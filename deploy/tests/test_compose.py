"""The Compose file: `docker compose config` when Docker's Compose plugin is
installed; always the compose-spec JSON schema (schemas/compose-spec.json,
Apache-2.0, see schemas/README.md) and the properties the stack relies on.
Whether its commands run as written is examples/tests/compose.rs (the same
commands, as processes on loopback)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from support import COMPOSE_FILE, ROOT, SCHEMAS, load_yaml

COMPOSE_DIR = COMPOSE_FILE.parent
SERVICES = {"registry": 7400, "router": 7500, "context": 7600}
AGENTS = ["intent-parser-1", "order-query-1", "order-query-2", "order-query-3", "shipping-rules-1", "reply-writer-1"]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return loaded


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def flags(service: dict[str, Any]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in service["command"] if arg.startswith("--") and "=" in arg)


def compose_plugin() -> list[str] | None:
    """`docker compose` when the plugin is installed (the engine is not needed)."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    return [docker, "compose"] if probe.returncode == 0 else None


def test_docker_compose_config_accepts_the_file() -> None:
    command = compose_plugin()
    if command is None:
        pytest.skip("Docker's Compose plugin is not installed; the schema test below checks the file instead")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), "config", "--quiet"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "WARN" not in result.stderr, result.stderr


def test_the_file_passes_the_compose_specification_schema() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(compose()), key=str)
    assert not errors, "\n".join(f"{'.'.join(map(str, error.path))}: {error.message}" for error in errors)


def test_the_schema_catches_mistakes() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    broken = compose()
    broken["services"]["router"]["depends_on"]["registry"]["condition"] = "service_ready"
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(broken))


def test_references_resolve() -> None:
    file = compose()
    declared_volumes = set(file["volumes"])
    for name, service in file["services"].items():
        for dependency in service.get("depends_on", {}):
            assert dependency in file["services"], f"{name} depends on unknown {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared_volumes, f"{name}: volume {source} is not declared"
        if "build" in service:
            context = (COMPOSE_DIR / service["build"]["context"]).resolve()
            assert context == ROOT
            stages = (ROOT / "Dockerfile").read_text(encoding="utf-8")
            assert f" AS {service['build']['target']}\n" in stages, f"{name}: no Dockerfile stage {service['build']}"


def test_services_wait_for_what_they_need() -> None:
    found = services()
    for name in [*SERVICES, *AGENTS]:
        assert found[name]["depends_on"]["secrets"]["condition"] == "service_completed_successfully", name
    assert found["registry"]["depends_on"]["etcd"]["condition"] == "service_healthy"
    assert found["router"]["depends_on"]["registry"]["condition"] == "service_healthy"
    for agent in AGENTS:
        for service in SERVICES:
            assert found[agent]["depends_on"][service]["condition"] == "service_healthy", agent
    for name in ["etcd", "redis", *SERVICES, *AGENTS]:
        assert "healthcheck" in found[name] or "AGENT_REACH_HEALTHCHECK_URL" in found[name].get("environment", {}), name


def test_redis_is_durable_and_the_router_has_tasks() -> None:
    found = services()
    command = found["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    router = flags(found["router"])
    assert router["--redis"] == "redis://redis:6379"
    assert router["--callback-secret-file"].startswith("/run/agent-reach/secrets/")


def test_ports_and_endpoints() -> None:
    found = services()
    for service, port in SERVICES.items():
        assert found[service]["ports"] == [f"127.0.0.1:{port}:{port}"], "host ports on loopback only"
        assert found[service]["environment"]["AGENT_REACH_HEALTHCHECK_URL"] == f"http://127.0.0.1:{port}/healthz"
        assert flags(found[service])["--listen"] == f"0.0.0.0:{port}"
    for agent in AGENTS:
        agent_flags = flags(found[agent])
        assert "ports" not in found[agent], "agents are reached through the router only"
        agent_port = agent_flags["--listen"].rsplit(":", 1)[1]
        assert agent_flags["--endpoint"] == f"http://{agent}:{agent_port}", "the service name, never an IP"
        name = agent_flags["--agent"]
        assert agent_flags["--token-file"] == f"/run/agent-reach/secrets/{name}.token"
        assert agent_flags["--registry"] == "http://registry:7400"
        assert agent_flags["--router"] == "http://router:7500"
        assert agent_flags["--context"] == "http://context:7600"
    weights = {flags(found[agent])["--agent-id"]: flags(found[agent]).get("--weight", "1") for agent in AGENTS}
    assert [weights[f"order_query-{index}"] for index in (1, 2, 3)] == ["3", "2", "1"], "the example's 3:2:1"


def test_policy_and_monitoring_files_match_the_repository() -> None:
    assert (COMPOSE_DIR / "acl" / "acl.yaml").read_text(encoding="utf-8") == (ROOT / "examples" / "acl.yaml").read_text(
        encoding="utf-8"
    ), "deploy/compose/acl/acl.yaml is the example's policy (examples/acl.yaml)"
    prometheus = load_yaml(COMPOSE_DIR / "prometheus.yml")
    targets = {job["static_configs"][0]["targets"][0] for job in prometheus["scrape_configs"]}
    assert targets == {f"{service}:{port}" for service, port in SERVICES.items()}
    assert prometheus["rule_files"] == ["alerts.yml"]
    mounts = services()["prometheus"]["volumes"]
    assert "../prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    dashboards = load_yaml(COMPOSE_DIR / "grafana" / "dashboards" / "agent-reach.yml")
    path = dashboards["providers"][0]["options"]["path"]
    assert f"../grafana:{path}:ro" in services()["grafana"]["volumes"]
    assert sorted(Path(ROOT / "deploy" / "grafana").glob("*.json")), "dashboards to provision"


def test_init_secrets_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck is not None, "shellcheck not found: run scripts/setup.sh (installs deploy/tests/requirements.txt)"
    result = subprocess.run(
        [shellcheck, str(COMPOSE_DIR / "init-secrets.sh")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


def test_prometheus_config_and_rules_check_out(tmp_path: Path) -> None:
    """promtool reads the Compose Prometheus config with the rules mounted beside it."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool not found: run scripts/setup.sh (installs prometheus)"
    shutil.copy(COMPOSE_DIR / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(ROOT / "deploy" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def etcd_flags() -> set[str]:
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    help_text = subprocess.run([etcd, "--help"], capture_output=True, text=True, check=False)
    return set(re.findall(r"^\s+(--[a-z-]+)", help_text.stdout + help_text.stderr, re.MULTILINE))


def test_etcd_flags_exist() -> None:
    """The etcd flags of the Compose file and the StatefulSet are etcd's
    (checked against the distribution's etcd; the images run 3.5)."""
    known = etcd_flags()
    assert "--listen-client-urls" in known, "cannot read etcd --help"
    used = [arg.split("=", 1)[0] for arg in services()["etcd"]["command"][1:]]
    statefulset = (ROOT / "deploy" / "k8s" / "base" / "etcd.yaml").read_text(encoding="utf-8")
    used += re.findall(r"^\s+- (--[a-z-]+)=", statefulset, re.MULTILINE)
    assert len(used) > 15
    assert not [flag for flag in used if flag not in known], f"etcd has no {set(used) - known}"
