"""redis-cluster.sh, the script the Redis Cluster nodes and their creation run
on Kubernetes (components/redis-cluster) and in Compose
(docker-compose.redis-cluster.yml), run: six nodes on loopback with the
distribution's redis-server, exactly as the manifests start them but for the
addresses (`127.0.0.1:PORT` for the DNS names, a temporary directory for the
volume). The cluster is created once; creating it again changes nothing; and
after every node stops and its nodes.conf holds addresses that are gone (what
recreated pods or containers with new IPs find), the nodes start again and
the cluster is whole.

What this cannot show: the images, DNS names and volumes of a real cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import REDIS_CLUSTER_SCRIPT

NODE_COUNT = 6


def redis_server() -> str:
    found = shutil.which("redis-server")
    assert found is not None, "redis-server not found: run scripts/setup.sh (installs redis-server)"
    return found


def free_ports(count: int) -> list[int]:
    """Ports free with their cluster bus port (port + 10000) beside them."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class Cluster:
    """Six nodes run by `redis-cluster.sh start`, as the StatefulSet does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = free_ports(NODE_COUNT)
        self.nodes = " ".join(f"127.0.0.1:{port}" for port in self.ports)
        self.processes: list[subprocess.Popen[bytes]] = []
        bin_dir = str(Path(redis_server()).parent)
        self.env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "NODES": self.nodes}

    def data(self, port: int) -> Path:
        return self.root / str(port)

    def start(self) -> None:
        for port in self.ports:
            self.data(port).mkdir(exist_ok=True)
            env = {
                **self.env,
                "SELF": "127.0.0.1",
                "REDIS_PORT": str(port),
                "DATA_DIR": str(self.data(port)),
                "NODE_TIMEOUT_MS": "2000",
            }
            log = (self.root / f"{port}.log").open("ab")
            self.processes.append(
                subprocess.Popen(["sh", str(REDIS_CLUSTER_SCRIPT), "start"], env=env, stdout=log, stderr=log)
            )

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []

    def run(self, *args: str, port: int | None = None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "REPLICAS": "1"}
        if port is not None:
            env["REDIS_PORT"] = str(port)
        return subprocess.run(
            ["sh", str(REDIS_CLUSTER_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300, check=False
        )

    def nodes_view(self) -> list[list[str]]:
        """`CLUSTER NODES` of the first node: id, address, flags, primary, …, slots."""
        answer = subprocess.run(
            ["redis-cli", "-p", str(self.ports[0]), "cluster", "nodes"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return [line.split() for line in answer.stdout.splitlines() if line.strip()]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    redis_server()
    nodes = Cluster(tmp_path)
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


def roles(view: list[list[str]]) -> dict[str, str]:
    return {line[0]: "replica" if "slave" in line[2] else "primary" for line in view}


def test_the_cluster_is_created_once_and_survives_new_addresses(cluster: Cluster) -> None:
    first = cluster.run("create")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "creating the cluster" in first.stdout
    view = cluster.nodes_view()
    assert sorted(roles(view).values()) == ["primary"] * 3 + ["replica"] * 3, view
    primaries = {line[0] for line in view if "master" in line[2]}
    assert {line[3] for line in view if "slave" in line[2]} == primaries, "a replica for each primary"
    assert all(len(line) > 8 for line in view if "master" in line[2]), "every primary serves slots"
    for port in cluster.ports:
        ready = cluster.run("ready", port=port)
        assert ready.returncode == 0, f"node {port} not ready after the creation"

    again = cluster.run("create")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "not creating it again" in again.stdout
    assert roles(cluster.nodes_view()) == roles(view), "a second run changes nothing"

    # Every node stops; their nodes.conf then name addresses nobody has any
    # more, as after recreated pods got new IPs. The start refreshes them.
    cluster.stop()
    gone = re.compile(r"^(\S+) 127\.0\.0\.1:", re.MULTILINE)
    for port in cluster.ports:
        conf = cluster.data(port) / "nodes.conf"
        text = conf.read_text(encoding="utf-8")
        assert ",127.0.0.1" in text, "each node's announced name is in nodes.conf"
        conf.write_text(gone.sub(r"\1 10.255.255.1:", text), encoding="utf-8")
    cluster.start()
    after = cluster.run("create")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "not creating it again" in after.stdout
    assert roles(cluster.nodes_view()) == roles(view), "the same nodes, the same roles"
    for port in cluster.ports:
        assert cluster.run("ready", port=port).returncode == 0, f"node {port} not back in the cluster"


def test_an_unknown_command_is_refused() -> None:
    result = subprocess.run(["sh", str(REDIS_CLUSTER_SCRIPT), "grow"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "usage:" in result.stderr
