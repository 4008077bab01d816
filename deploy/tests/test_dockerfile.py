"""The Dockerfile, checked without a Docker engine (this machine and CI have
only the client): hadolint, and a reading of its stages. Building the images
is not tested here."""

from __future__ import annotations

import re
import shutil
import subprocess

from support import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> dict[str, list[tuple[str, str]]]:
    result: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for word, rest in instructions():
        if word == "FROM":
            image, _, name = rest.partition(" AS ")
            current = name.strip()
            result[current] = [("FROM", image.strip())]
        elif current:
            result[current].append((word, rest))
    return result


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint is not None, "hadolint not found: run scripts/setup.sh (installs deploy/tests/requirements.txt)"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_stages_and_the_default_target() -> None:
    found = stages()
    assert list(found) == ["builder", "init", "example-agent", "agent-reach"], "agent-reach is last: the default target"
    assert found["builder"][0] == ("FROM", "rust:1-bookworm")
    build = " ".join(rest for word, rest in found["builder"] if word == "RUN")
    assert "cargo build --release --locked -p agent-reach-cli" in build


def test_runtime_images_are_non_root_shell_free_and_health_checked() -> None:
    found = stages()
    for name in ("agent-reach", "example-agent"):
        stage = dict(found[name])
        assert stage["FROM"].startswith("gcr.io/distroless/cc-debian12"), "distroless: no shell at run time"
        assert stage["USER"] == "65532:65532", name
        assert stage["HEALTHCHECK"].endswith('CMD ["/usr/local/bin/agent-reach", "healthcheck"]'), name
        assert stage["ENTRYPOINT"].startswith('["'), f"{name}: exec form (there is no shell)"


def test_every_copy_source_exists() -> None:
    found = stages()
    for name, stage in found.items():
        for word, rest in stage:
            if word != "COPY":
                continue
            parts = rest.split()
            sources = [part for part in parts[:-1] if not part.startswith("--")]
            from_stage = [part.split("=", 1)[1] for part in parts if part.startswith("--from=")]
            if from_stage:
                assert from_stage[0] in found, f"{name}: COPY --from={from_stage[0]} names no stage"
                assert all(source.startswith("/out/") for source in sources), f"{name}: {rest}"
            else:
                for source in sources:
                    assert (ROOT / source).exists(), f"{name}: COPY source {source} does not exist"


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "target/" in ignored and ".git/" in ignored
