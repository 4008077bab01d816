"""The Compose file: `docker compose config` when Docker's Compose plugin is
installed; always the compose-spec JSON schema (schemas/compose-spec.json,
Apache-2.0, see schemas/README.md) and the properties the stack relies on.
Whether its commands run as written is examples/tests/compose.rs (the same
commands, as processes on loopback).

The Redis Cluster override (docker-compose.redis-cluster.yml, used on top of
the file with a second `-f`) is checked the same way, as the model Compose
makes of the two files: merged here by Compose's rules (mappings merged,
sequences appended, `command` and `healthcheck.test` replaced, `!override`
replacing and `!reset` removing what the first file says)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from support import COMPOSE_CLUSTER_FILE, COMPOSE_FILE, REDIS_CLUSTER_SCRIPT, ROOT, SCHEMAS, load_yaml

COMPOSE_DIR = COMPOSE_FILE.parent
SERVICES = {"registry": 7400, "router": 7500, "context": 7600}
AGENTS = ["intent-parser-1", "order-query-1", "order-query-2", "order-query-3", "shipping-rules-1", "reply-writer-1"]
CLUSTER_NODES = [f"redis-cluster-{index}" for index in range(6)]
CLUSTER_URL = "redis+cluster://" + ",".join(f"{node}:6379" for node in CLUSTER_NODES)
# What a second file replaces rather than appends to (Compose's merge rules).
REPLACED = {"command", "entrypoint", "test"}


class Override:
    """A value tagged `!override`: it replaces the first file's."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Reset:
    """A value tagged `!reset`: the first file's is removed."""


class ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's two merge tags."""


def construct_override(loader: yaml.SafeLoader, node: yaml.Node) -> Override:
    if isinstance(node, yaml.MappingNode):
        return Override(loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Override(loader.construct_sequence(node, deep=True))
    return Override(loader.construct_scalar(node))  # type: ignore[arg-type]


def construct_reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


ComposeLoader.add_constructor("!override", construct_override)
ComposeLoader.add_constructor("!reset", construct_reset)


def untagged(value: Any) -> Any:
    """The value a file says on its own: `!override` dropped, `!reset` keys left out."""
    if isinstance(value, Override):
        return untagged(value.value)
    if isinstance(value, dict):
        return {key: untagged(item) for key, item in value.items() if not isinstance(item, Reset)}
    if isinstance(value, list):
        return [untagged(item) for item in value]
    return value


def merge(first: Any, second: Any, key: str = "") -> Any:
    """`second` on top of `first`, by Compose's merge rules (docs.docker.com/reference/compose-file/merge/)."""
    if isinstance(second, Override):
        return untagged(second)
    if isinstance(first, dict) and isinstance(second, dict):
        merged = dict(first)
        for name, value in second.items():
            if isinstance(value, Reset):
                merged.pop(name, None)
            elif name in merged:
                merged[name] = merge(merged[name], value, name)
            else:
                merged[name] = untagged(value)
        return merged
    if isinstance(first, list) and isinstance(second, list) and key not in REPLACED:
        return first + [item for item in untagged(second) if item not in first]
    return untagged(second)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = load_yaml(COMPOSE_FILE)
    return loaded


def cluster_override() -> Any:
    return yaml.load(COMPOSE_CLUSTER_FILE.read_text(encoding="utf-8"), Loader=ComposeLoader)


def with_cluster() -> dict[str, Any]:
    """The model of `docker compose -f docker-compose.yml -f docker-compose.redis-cluster.yml`."""
    merged: dict[str, Any] = merge(compose(), cluster_override())
    return merged


# The stack as users run it: alone, and with the Redis Cluster override.
MODELS = {"docker-compose.yml": compose, "with-redis-cluster": with_cluster}


def services(model: str = "docker-compose.yml") -> dict[str, Any]:
    found: dict[str, Any] = MODELS[model]()["services"]
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


@pytest.mark.parametrize("files", [[COMPOSE_FILE], [COMPOSE_FILE, COMPOSE_CLUSTER_FILE]], ids=list(MODELS))
def test_docker_compose_config_accepts_the_file(files: list[Path]) -> None:
    command = compose_plugin()
    if command is None:
        pytest.skip("Docker's Compose plugin is not installed; the schema test below checks the file instead")
    selected = [argument for file in files for argument in ("-f", str(file))]
    result = subprocess.run([*command, *selected, "config", "--quiet"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "WARN" not in result.stderr, result.stderr


@pytest.mark.parametrize("model", [*MODELS, "docker-compose.redis-cluster.yml alone"])
def test_the_file_passes_the_compose_specification_schema(model: str) -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    file = MODELS[model]() if model in MODELS else untagged(cluster_override())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(file), key=str)
    assert not errors, "\n".join(f"{'.'.join(map(str, error.path))}: {error.message}" for error in errors)


def test_the_schema_catches_mistakes() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    broken = compose()
    broken["services"]["router"]["depends_on"]["registry"]["condition"] = "service_ready"
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(broken))


@pytest.mark.parametrize("model", MODELS)
def test_references_resolve(model: str) -> None:
    file = MODELS[model]()
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


@pytest.mark.parametrize("model", MODELS)
def test_services_wait_for_what_they_need(model: str) -> None:
    found = services(model)
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


def test_the_merge_follows_composes_rules() -> None:
    """The merge the checks below rely on, on the cases the override uses."""
    first = {"services": {"a": {"command": ["x", "--y"], "depends_on": {"r": {}, "s": {}}, "profiles": ["p"]}}}
    second = yaml.load(
        "services:\n  a:\n    command: [z]\n    depends_on: !override {s: {}}\n    profiles: [q]\n"
        "    ports: !reset []\n  b: {image: i}\n",
        Loader=ComposeLoader,
    )
    assert merge(first, second) == {
        "services": {"a": {"command": ["z"], "depends_on": {"s": {}}, "profiles": ["p", "q"]}, "b": {"image": "i"}}
    }


def test_the_redis_cluster_is_six_durable_nodes() -> None:
    found = services("with-redis-cluster")
    script = REDIS_CLUSTER_SCRIPT.read_text(encoding="utf-8")
    for flag in (
        "--cluster-enabled yes",
        "--appendonly yes --appendfsync everysec",
        '--cluster-node-timeout "${NODE_TIMEOUT_MS:-5000}"',
        "--cluster-require-full-coverage no",
        '--cluster-announce-hostname "$SELF"',
        "--cluster-preferred-endpoint-type hostname",
    ):
        assert flag in script, f"redis-cluster.sh start: {flag}"
    mount = f"../k8s/components/redis-cluster/{REDIS_CLUSTER_SCRIPT.name}:/scripts/redis-cluster.sh:ro"
    assert (COMPOSE_DIR / mount.split(":")[0]).resolve() == REDIS_CLUSTER_SCRIPT, "the same script as Kubernetes"
    nodes = [name for name in found if name.startswith("redis-cluster-") and name != "redis-cluster-create"]
    assert nodes == CLUSTER_NODES
    for node in nodes:
        service = found[node]
        assert service["command"] == ["sh", "/scripts/redis-cluster.sh", "start"]
        environment = service["environment"]
        assert environment["SELF"] == node, "each node announces its service name"
        assert environment["NODES"].split() == [f"{name}:6379" for name in CLUSTER_NODES]
        assert int(environment["NODE_TIMEOUT_MS"]) > 0
        assert service["volumes"] == [f"{node}:/data", mount], "a volume of its own for nodes.conf and the AOF"
        assert service["healthcheck"]["test"] == ["CMD", "sh", "/scripts/redis-cluster.sh", "ready"]
        assert service["user"] == "999:999" and service["read_only"] is True
        assert "ports" not in service, "the nodes are reached on the stack's network only"


def test_the_redis_cluster_is_created_once_before_the_services_use_it() -> None:
    base, found = services(), services("with-redis-cluster")
    create = found["redis-cluster-create"]
    assert create["restart"] == "no"
    assert create["command"] == ["sh", "/scripts/redis-cluster.sh", "create"]
    assert create["environment"]["REPLICAS"] == "1", "three primaries, a replica each"
    assert create["environment"]["NODES"].split() == [f"{name}:6379" for name in CLUSTER_NODES]
    assert set(create["depends_on"]) == set(CLUSTER_NODES)
    script = REDIS_CLUSTER_SCRIPT.read_text(encoding="utf-8")
    assert 'redis-cli --cluster create $NODES --cluster-replicas "${REPLICAS:-1}" --cluster-yes' in script
    assert found["redis"]["profiles"] == ["single-redis"], "the one Redis does not start"
    for service in ("router", "context"):
        depends = found[service]["depends_on"]
        assert "redis" not in depends, service
        assert depends["redis-cluster-create"]["condition"] == "service_completed_successfully", service
        assert {name: depends[name] for name in depends if name != "redis-cluster-create"} == {
            name: value for name, value in base[service]["depends_on"].items() if name != "redis"
        }, f"{service} waits for what it waited for before, the cluster instead of the one Redis"
        # The same command but for the store: the cluster's nodes as seeds, WAIT 1 after each write.
        command = found[service]["command"]
        at = command.index(f"--redis={CLUSTER_URL}")
        assert command[at + 1] == "--redis-wait-replicas=1", service
        assert [*command[:at], *command[at + 2 :]] == [
            arg for arg in base[service]["command"] if not arg.startswith("--redis=")
        ], f"{service}: the override's command drifted from docker-compose.yml"
        assert base[service]["command"][at] == "--redis=redis://redis:6379"


@pytest.mark.parametrize("model", MODELS)
def test_ports_and_endpoints(model: str) -> None:
    found = services(model)
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
