"""Kubernetes manifests: every kustomization renders (no warnings), every
object passes its schema strictly, and the properties issue 23 asks for hold.

Built-in kinds are validated with kubernetes-validate's bundled schemas
(strict: unknown fields fail) for the oldest and the newest Kubernetes this
repository supports. The two Prometheus Operator kinds (CRDs) are validated
against the schemas in schemas/ (strict as well); any other kind fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from support import (
    CLUSTER_OVERLAYS,
    DEPLOY,
    K8S,
    OVERLAYS,
    REDIS_CLUSTER_SCRIPT,
    SCHEMAS,
    SENTINEL_OVERLAYS,
    Doc,
    containers,
    find,
    kustomize,
    rendered,
)

KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.monitoring.coreos.com-v1.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.monitoring.coreos.com-v1.yaml",
}
SERVICES = {"registry": 7400, "router": 7500, "context": 7600}
ACL_MOUNT = "/etc/agent-reach/acl"
SENTINEL_URL = (
    "redis+sentinel://"
    + ",".join(f"redis-sentinel-{index}.redis-sentinel:26379" for index in range(3))
    + "/agent-reach"
)
CLUSTER_NODES = [f"redis-cluster-{index}" for index in range(6)]
CLUSTER_URL = "redis+cluster://" + ",".join(f"{node}.redis-cluster:6379" for node in CLUSTER_NODES)
SENTINEL_OBJECTS = [
    ("StatefulSet", "redis"),
    ("StatefulSet", "redis-sentinel"),
    ("Service", "redis"),
    ("Service", "redis-sentinel"),
    ("PodDisruptionBudget", "redis"),
    ("PodDisruptionBudget", "redis-sentinel"),
    ("ConfigMap", "redis-scripts"),
    ("NetworkPolicy", "redis"),
    ("NetworkPolicy", "redis-sentinel"),
]


def strict(schema: Any) -> Any:
    """Unknown fields fail, as kubernetes-validate's strict mode does."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


def crd_schema(doc: Doc) -> Any:
    name = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if name is None:
        return None
    return strict(yaml.safe_load((SCHEMAS / name).read_text(encoding="utf-8")))


def deployment(docs: list[Doc], service: str) -> Doc:
    return find(docs, "Deployment", f"agent-reach-{service}")


def args_of(container: Doc) -> list[str]:
    found: list[str] = container.get("args", [])
    return found


def flag(container: Doc, name: str) -> str:
    for arg in args_of(container):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{container['name']} has no {name}=")


def env_names(container: Doc) -> set[str]:
    return {entry["name"] for entry in container.get("env", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_renders_without_warnings(overlay: str) -> None:
    result = kustomize(overlay)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"kustomize warned:\n{result.stderr}"
    assert result.stdout.strip(), "rendered nothing"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_passes_its_schema(overlay: str, version: str) -> None:
    problems = []
    for doc in rendered(overlay):
        what = f"{doc['kind']}/{doc['metadata']['name']}"
        schema = crd_schema(doc)
        if schema is not None:
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
            problems += [f"{what}: {'.'.join(map(str, error.path))}: {error.message}" for error in errors]
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(f"{what}: no schema to validate with ({error.message})")
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{what}: {'.'.join(map(str, error.path))}: {error.message}")
    assert not problems, "\n".join(problems)


def test_the_crd_schemas_catch_mistakes() -> None:
    """The bundled CRD schemas are not vacuous: a misspelt field fails."""
    monitor = find(rendered("base"), "ServiceMonitor", "agent-reach")
    schema = crd_schema(monitor)
    broken = {**monitor, "spec": {**monitor["spec"], "endpoint": monitor["spec"]["endpoints"]}}
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(broken))
    rule = find(rendered("base"), "PrometheusRule", "agent-reach")
    broken_rule = {"spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "for": "five minutes", "expr": "1"}]}]}}
    assert list(jsonschema.Draft202012Validator(crd_schema(rule)).iter_errors(broken_rule))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_is_the_alert_rules_file(overlay: str) -> None:
    rule = find(rendered(overlay), "PrometheusRule", "agent-reach")
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == alerts["groups"], "monitoring.yaml drifted from deploy/prometheus/alerts.yml"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_are_replicated_probed_and_bounded(overlay: str) -> None:
    docs = rendered(overlay)
    budgets = [doc for doc in docs if doc["kind"] == "PodDisruptionBudget"]
    autoscalers = [doc for doc in docs if doc["kind"] == "HorizontalPodAutoscaler"]
    for service, port in SERVICES.items():
        workload = deployment(docs, service)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        scaler = [hpa for hpa in autoscalers if hpa["spec"]["scaleTargetRef"]["name"] == workload["metadata"]["name"]]
        if service == "router":
            assert len(scaler) == 1, "the router has a HorizontalPodAutoscaler"
            assert "replicas" not in workload["spec"], "the autoscaler owns the router's replica count"
            assert scaler[0]["spec"]["minReplicas"] >= 2
        else:
            assert workload["spec"]["replicas"] >= 2, service
        assert labels["agent-reach.io/role"] == service
        assert any(matches(pdb["spec"]["selector"]["matchLabels"], labels) for pdb in budgets), f"{service}: no PDB"
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = containers(workload)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", service
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", service
        assert container["ports"] == [{"name": "http", "containerPort": port}]
        assert flag(container, "--listen") == f"0.0.0.0:{port}"
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), service
        assert "memory" in resources["limits"], service
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_etcd_is_three_members_on_three_nodes(overlay: str) -> None:
    docs = rendered(overlay)
    etcd = find(docs, "StatefulSet", "etcd")
    headless = find(docs, "Service", etcd["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert etcd["spec"]["replicas"] == 3
    terms = etcd["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert any(term["topologyKey"] == "kubernetes.io/hostname" for term in terms)
    (member,) = containers(etcd)
    cluster = flag(member, "--initial-cluster").split(",")
    assert [entry.split("=")[0] for entry in cluster] == ["etcd-0", "etcd-1", "etcd-2"]
    registry = containers(deployment(docs, "registry"))[0]
    endpoints = flag(registry, "--etcd").split(",")
    assert endpoints == [f"http://etcd-{index}.etcd:2379" for index in range(3)], "the registry uses every member"
    quorum = [pdb for pdb in docs if pdb["kind"] == "PodDisruptionBudget" and pdb["metadata"]["name"] == "etcd"]
    assert quorum[0]["spec"]["minAvailable"] == 2


@pytest.mark.parametrize("overlay", SENTINEL_OVERLAYS)
def test_redis_has_replicas_and_three_sentinels(overlay: str) -> None:
    docs = rendered(overlay)
    assert find(docs, "StatefulSet", "redis")["spec"]["replicas"] == 3, "one primary, two replicas"
    sentinels = find(docs, "StatefulSet", "redis-sentinel")
    assert sentinels["spec"]["replicas"] == 3
    scripts = find(docs, "ConfigMap", "redis-scripts")["data"]
    assert "--appendonly yes --appendfsync everysec" in scripts["redis-start.sh"]
    assert "sentinel monitor agent-reach $primary 6379 2" in scripts["sentinel-start.sh"], "quorum 2 of 3"
    assert "port 26379" in scripts["sentinel-start.sh"]
    assert find(docs, "Service", sentinels["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    for service in ("router", "context"):
        container = containers(deployment(docs, service))[0]
        assert flag(container, "--redis") == SENTINEL_URL, f"{service} asks every Sentinel for `agent-reach`"
    assert not [doc for doc in docs if doc["metadata"]["name"].startswith("redis-cluster")]


def redis_scripts(overlay: str) -> dict[str, str]:
    docs = rendered(overlay)
    name = "redis-cluster-scripts" if overlay in CLUSTER_OVERLAYS else "redis-scripts"
    found: dict[str, str] = find(docs, "ConfigMap", name)["data"]
    return found


@pytest.mark.parametrize("overlay", ["base", *CLUSTER_OVERLAYS])
def test_redis_start_scripts_pass_shellcheck(overlay: str, tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck is not None, "shellcheck not found: run scripts/setup.sh (installs deploy/tests/requirements.txt)"
    for name, text in redis_scripts(overlay).items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        result = subprocess.run([shellcheck, "--shell=sh", str(path)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{name}:\n{result.stdout}"


def env_of(container: Doc) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in container.get("env", []) if "value" in entry}


@pytest.mark.parametrize("overlay", CLUSTER_OVERLAYS)
def test_redis_cluster_is_six_nodes_three_primaries_a_replica_each(overlay: str) -> None:
    docs = rendered(overlay)
    nodes = find(docs, "StatefulSet", "redis-cluster")
    assert nodes["spec"]["replicas"] == 6
    assert nodes["spec"]["podManagementPolicy"] == "Parallel", "a node is ready only once the cluster is"
    headless = find(docs, "Service", nodes["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert {port["port"] for port in headless["spec"]["ports"]} == {6379, 16379}
    pod = nodes["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (node,) = containers(nodes)
    assert node["command"] == ["/bin/sh", "/scripts/redis-cluster.sh", "start"]
    assert node["readinessProbe"]["exec"]["command"] == ["/bin/sh", "/scripts/redis-cluster.sh", "ready"]
    assert node["livenessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    assert {"cpu", "memory"} <= set(node["resources"]["requests"]) and "memory" in node["resources"]["limits"]
    assert node["securityContext"]["readOnlyRootFilesystem"] is True
    assert node["securityContext"]["allowPrivilegeEscalation"] is False
    assert [mount["mountPath"] for mount in node["volumeMounts"]] == ["/data", "/scripts"]
    (claim,) = nodes["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data", "nodes.conf and the append-only file outlive the pod"
    names = [f"{name}.redis-cluster.$(POD_NAMESPACE).svc" for name in CLUSTER_NODES]
    environment = env_of(node)
    assert environment["SELF"] == "$(POD_NAME).redis-cluster.$(POD_NAMESPACE).svc"
    assert environment["NODES"].split() == [f"{name}:6379" for name in names]
    assert int(environment["NODE_TIMEOUT_MS"]) > 0
    budget = find(docs, "PodDisruptionBudget", "redis-cluster")
    assert budget["spec"]["maxUnavailable"] == 1
    assert matches(budget["spec"]["selector"]["matchLabels"], nodes["spec"]["template"]["metadata"]["labels"])
    job = find(docs, "Job", "redis-cluster-create")
    (create,) = containers(job)
    assert create["command"] == ["/bin/sh", "/scripts/redis-cluster.sh", "create"]
    assert env_of(create)["NODES"] == environment["NODES"]
    assert env_of(create)["REPLICAS"] == "1", "three primaries, a replica each"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    script = redis_scripts(overlay)["redis-cluster.sh"]
    assert script == REDIS_CLUSTER_SCRIPT.read_text(encoding="utf-8")
    assert 'redis-cli --cluster create $NODES --cluster-replicas "${REPLICAS:-1}" --cluster-yes' in script
    for setting in ("--cluster-enabled yes", "--appendonly yes --appendfsync everysec", "--cluster-announce-hostname"):
        assert setting in script
    for service in ("router", "context"):
        container = containers(deployment(docs, service))[0]
        assert flag(container, "--redis") == CLUSTER_URL, f"{service}: every node a seed"
        assert flag(container, "--redis-wait-replicas") == "1", f"{service}: each write waits for a replica"
    for kind, name in SENTINEL_OBJECTS:
        assert not [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name], (
            f"{kind}/{name}: the Sentinel Redis is left out"
        )
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "agent-reach", f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("overlay", CLUSTER_OVERLAYS)
def test_redis_cluster_is_reached_only_by_routers_context_and_its_nodes(overlay: str) -> None:
    docs = rendered(overlay)
    policy = find(docs, "NetworkPolicy", "redis-cluster")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    node_labels = find(docs, "StatefulSet", "redis-cluster")["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["spec"]["podSelector"]["matchLabels"], node_labels)
    allowed: dict[int, set[str]] = {}
    for rule in policy["spec"]["ingress"]:
        roles = {source["podSelector"]["matchLabels"]["agent-reach.io/role"] for source in rule["from"]}
        for port in rule["ports"]:
            allowed.setdefault(port["port"], set()).update(roles)
    assert allowed == {
        6379: {"router", "context", "redis-cluster-create", "redis-cluster"},
        16379: {"redis-cluster"},
    }, "clients on 6379, the cluster bus among the nodes only"
    job_labels = find(docs, "Job", "redis-cluster-create")["spec"]["template"]["metadata"]["labels"]
    assert job_labels["agent-reach.io/role"] == "redis-cluster-create"
    assert node_labels["agent-reach.io/role"] == "redis-cluster"
    selected = [
        doc["metadata"]["name"]
        for doc in docs
        if doc["kind"] == "NetworkPolicy"
        and doc["metadata"]["name"] != "redis-cluster"
        and matches(doc["spec"]["podSelector"].get("matchLabels", {}), node_labels)
    ]
    assert not selected, f"no other policy selects the nodes: {selected}"


def test_the_redis_cluster_component_applies_to_the_base_too(tmp_path: Path) -> None:
    """An overlay of the base with the component, as deploy/README.md says to write one."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # Relative, as kustomize wants them.
                "resources": [os.path.relpath(K8S / "base", tmp_path)],
                "components": [os.path.relpath(K8S / "components" / "redis-cluster", tmp_path)],
            }
        ),
        encoding="utf-8",
    )
    result = kustomize(tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    docs = rendered(tmp_path)
    assert find(docs, "StatefulSet", "redis-cluster")["spec"]["replicas"] == 6
    for service in ("router", "context"):
        assert flag(containers(deployment(docs, service))[0], "--redis") == CLUSTER_URL
    for version in KUBERNETES_VERSIONS:
        for doc in docs:
            if crd_schema(doc) is None:
                kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_acl_configmap_is_mounted_as_a_directory(overlay: str) -> None:
    """The kubelet's `..data` symlink swap reaches the services only through a
    directory mount of a ConfigMap whose name does not change with its content."""
    docs = rendered(overlay)
    acl = find(docs, "ConfigMap", "agent-reach-acl")
    assert yaml.safe_load(acl["data"]["acl.yaml"])["version"] == 1
    for service in SERVICES:
        workload = deployment(docs, service)
        container = containers(workload)[0]
        assert flag(container, "--acl") == f"{ACL_MOUNT}/acl.yaml"
        (mount,) = [mount for mount in container["volumeMounts"] if mount["mountPath"] == ACL_MOUNT]
        assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
        volumes = {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes[mount["name"]]["configMap"]["name"] == "agent-reach-acl"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keys_come_from_secrets_never_from_the_repository(overlay: str) -> None:
    docs = rendered(overlay)
    assert not [doc for doc in docs if doc["kind"] == "Secret"], "no key material is rendered from the repository"
    for service in SERVICES:
        workload = deployment(docs, service)
        volumes = workload["spec"]["template"]["spec"]["volumes"]
        secret_volumes = {volume["name"] for volume in volumes if "secret" in volume}
        container = containers(workload)[0]
        for entry in container.get("env", []):
            assert "SECRET" not in entry["name"] or entry["value"].startswith("/run/agent-reach/"), entry
        for mount in container["volumeMounts"]:
            if mount["name"] in secret_volumes:
                assert mount["readOnly"] is True
                assert mount["mountPath"].startswith("/run/agent-reach/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agents_accept_traffic_only_from_routers(overlay: str) -> None:
    docs = rendered(overlay)
    policy = find(docs, "NetworkPolicy", "agent-reach-agents-from-routers")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"agent-reach.io/role": "agent"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"] == {"agent-reach.io/role": "router"}
    mesh = source["namespaceSelector"]["matchLabels"]
    namespace = find(docs, "Namespace", "agent-reach")
    assert matches(mesh, namespace["metadata"]["labels"]), "the routers' namespace is in the mesh"
    router_labels = deployment(docs, "router")["spec"]["template"]["metadata"]["labels"]
    assert matches(source["podSelector"]["matchLabels"], router_labels)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_every_service(overlay: str) -> None:
    docs = rendered(overlay)
    monitor = find(docs, "ServiceMonitor", "agent-reach")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    for service in SERVICES:
        target = find(docs, "Service", f"agent-reach-{service}")
        assert matches(selector, target["metadata"]["labels"]), service
        assert endpoint["port"] in [port["name"] for port in target["spec"]["ports"]]
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("overlay", ["overlays/production", *CLUSTER_OVERLAYS])
def test_production_overlay_scales_and_verifies_with_public_keys(overlay: str) -> None:
    docs = rendered(overlay)
    for service in SERVICES:
        workload = deployment(docs, service)
        container = containers(workload)[0]
        names = env_names(container)
        assert "AGENT_REACH_AUTH_PUBLIC_KEY" in names and "AGENT_REACH_AUTH_HS256_SECRET_FILE" not in names, service
        if service != "router":
            assert workload["spec"]["replicas"] == 3
    router = containers(deployment(docs, "router"))[0]
    assert "AGENT_REACH_REGISTRY_TOKEN_FILE" in env_names(router), (
        "with public keys the router cannot sign its own token"
    )
    assert find(docs, "HorizontalPodAutoscaler", "agent-reach-router")["spec"]["minReplicas"] == 3
    base = containers(deployment(rendered("base"), "router"))[0]
    assert "AGENT_REACH_AUTH_HS256_SECRET_FILE" in env_names(base), "the base keeps the shared secret"
