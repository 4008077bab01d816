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
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# Every kustomization a user may apply.
OVERLAYS = ["base", "overlays/production"]

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


def kustomize(overlay: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "kustomize", str(K8S / overlay)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def rendered(overlay: str) -> list[Doc]:
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
