"""Shared helpers of the deploy checks: paths, YAML loading, kustomize."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "compose" / "docker-compose.yml"
# Used on top of COMPOSE_FILE (`-f ... -f ...`): Redis Cluster instead of the one Redis.
COMPOSE_CLUSTER_FILE = DEPLOY / "compose" / "docker-compose.redis-cluster.yml"
# The Redis Cluster nodes and their creation: Kubernetes (the component) and Compose alike.
REDIS_CLUSTER_SCRIPT = K8S / "components" / "redis-cluster" / "redis-cluster.sh"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# Every kustomization a user may apply: on Sentinel, and on Redis Cluster
# (the components/redis-cluster component).
SENTINEL_OVERLAYS = ["base", "overlays/production"]
CLUSTER_OVERLAYS = ["overlays/production-redis-cluster"]
OVERLAYS = SENTINEL_OVERLAYS + CLUSTER_OVERLAYS

Doc = dict[str, Any]


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as file:
        return yaml.safe_load(file)


def load_yaml_all(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise AssertionError("kubectl not found: run scripts/setup.sh (installs kubectl with kustomize)")
    return found


def kustomize(overlay: str | Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize` of a directory under k8s/ (or any directory)."""
    return subprocess.run(
        [kubectl(), "kustomize", str(K8S / overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def rendered(overlay: str | Path) -> list[Doc]:
    result = kustomize(overlay)
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed:\n{result.stderr}"
    return load_yaml_all(result.stdout)


def containers(doc: Doc) -> list[Doc]:
    """The containers of a workload's pod template (none for other kinds)."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    found: list[Doc] = spec.get("containers", [])
    return found


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind}/{name} in the rendered output")
