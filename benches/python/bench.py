"""Python SDK cost: an SDK echo agent's throughput through the router against a bare
uvicorn echo app doing the same work (decode the envelope, answer the payload), same run.

    python benches/python/bench.py [--rounds 3] [--duration-s 5] [--connections 32]

Starts etcd, Redis, the registry and the router (the release build when present:
`cargo build --release -p agent-reach-cli`; the debug build otherwise, which may make
the router the bottleneck), both agents as their own processes on the same uvicorn
settings, and `wrk` against `POST /v1/invoke` for each capability. Rounds alternate the
two targets so both share the box's phases; the verdict is on the median round.
Target (issue 22): the SDK costs <= 10 % of the bare app's requests per second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "sdk" / "python"))

from tests.support.stack import Process, Stack, wait_until  # noqa: E402


def wrk(url: str, script: Path, seconds: int, connections: int) -> tuple[float, str, int]:
    """(requests/s, p50 latency, non-2xx answers) of one wrk run."""
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, p50, int(bad.group(1)) if bad else 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def delivery_path_us() -> tuple[float, float]:
    """In-process, best of 12: the SDK's whole delivery path (envelope → handler → answer
    bytes) against the bare app's decode/encode of the same envelope, in microseconds."""
    import asyncio
    import time

    from agent_reach import Agent
    from agent_reach.ctx import Links
    from agent_reach.server import AgentState, serve_invoke
    from agent_reach.status import LoadThresholds, Status, StatusTracker

    agent = Agent("py_agent", insecure_accept_unverified=True)

    @agent.handler("test.echo_sdk")
    async def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    async def measure() -> tuple[float, float]:
        links = Links(http=None, router=None, contexts=None, token="")  # type: ignore[arg-type]
        state = AgentState(
            agent_id="bench_sdk-1",
            handlers=agent.handlers,
            links=links,
            verifier=None,
            max_concurrency=256,
            max_body_bytes=1 << 20,
            ttl_s=15,
            status=StatusTracker(256, LoadThresholds()),
        )
        state.status.phase = Status.READY
        traceparent = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"
        best_sdk = best_bare = float("inf")
        for round_number in range(12):
            deadline = time.time_ns() // 1_000_000 + 60_000
            bodies = [
                json.dumps(
                    {
                        "version": "1.0",
                        "request_id": f"r{round_number}-{i}",
                        "capability": "test.echo_sdk",
                        "capability_version": "1.0.0",
                        "source": "tester",
                        "priority": "normal",
                        "deadline": deadline,
                        "attempt": 1,
                        "payload": {"text": "hello, agent", "n": 42},
                    }
                ).encode()
                for i in range(5000)
            ]
            started = time.perf_counter()
            for body in bodies:
                await serve_invoke(state, None, traceparent, body)
            best_sdk = min(best_sdk, (time.perf_counter() - started) / len(bodies))
            started = time.perf_counter()
            for body in bodies:
                json.dumps({"output": json.loads(body)["payload"]}).encode()
            best_bare = min(best_bare, (time.perf_counter() - started) / len(bodies))
        return best_sdk * 1e6, best_bare * 1e6

    return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration-s", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()

    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    release = target / "release"
    if (release / "agent-reach").is_file():
        os.environ["AGENT_REACH_BIN_DIR"] = str(release)
        print(f"router: release build ({release / 'agent-reach'})")
    else:
        print("router: DEBUG build (no release build found): the router may bound both numbers")
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401

        print("uvicorn: httptools + uvloop")
    except ImportError:
        print("uvicorn: h11 + asyncio (pip install './sdk/python[fast]' for httptools + uvloop)")

    stack = Stack()
    work = Path(tempfile.mkdtemp(prefix="python-bench-"))
    agents: dict[str, Process] = {}
    try:
        env = stack.agent_env("py_agent")
        agents["sdk"] = Process([sys.executable, str(HERE / "sdk_echo.py")], work / "sdk.log", env)
        agents["bare"] = Process([sys.executable, str(HERE / "bare_echo.py")], work / "bare.log", env)
        wait_until(lambda: stack.routable("test.echo_sdk", "bench_sdk-1"), 30, "the SDK agent")
        wait_until(lambda: stack.routable("test.echo_bare", "bench_bare-1"), 30, "the bare app")
        token = stack.token("tester", ttl_s=24 * 3600)
        scripts = {}
        for name in agents:
            script = work / f"{name}.lua"
            body = json.dumps({"capability": f"test.echo_{name}", "payload": {"text": "hello, agent", "n": 42}})
            script.write_text(
                'wrk.method = "POST"\n'
                f"wrk.body = '{body}'\n"
                'wrk.headers["content-type"] = "application/json"\n'
                f'wrk.headers["authorization"] = "Bearer {token}"\n'
            )
            scripts[name] = script
        url = f"{stack.router.url}/v1/invoke"
        for name in agents:  # warm-up: connections, caches, the router's pools
            wrk(url, scripts[name], 1, args.connections)
        results: dict[str, list[tuple[float, str, float]]] = {"sdk": [], "bare": []}
        for round_number in range(args.rounds):
            order = ["sdk", "bare"] if round_number % 2 == 0 else ["bare", "sdk"]
            for name in order:
                pid = agents[name].popen.pid
                before = cpu_seconds(pid)
                rps, p50, bad = wrk(url, scripts[name], args.duration_s, args.connections)
                used = cpu_seconds(pid) - before
                if bad:
                    raise SystemExit(f"{name}: {bad} non-2xx answers; see {work}")
                per_request_us = used / (rps * args.duration_s) * 1e6
                results[name].append((rps, p50, per_request_us))
            sdk, bare = results["sdk"][-1][0], results["bare"][-1][0]
            print(f"round {round_number + 1}: sdk {sdk:,.0f} req/s, bare {bare:,.0f} req/s ({sdk / bare:.1%})")
        print()
        medians = {}
        for name in ("sdk", "bare"):
            rounds = sorted(results[name])
            rps, p50, _ = rounds[len(rounds) // 2]
            medians[name] = rps
            print(
                f"{name:>4}: {rps:,.0f} req/s (median of {args.rounds}), p50 {p50}, "
                f"agent CPU {statistics.median(r[2] for r in results[name]):.0f} us/request"
            )
        ratios = sorted(s[0] / b[0] for s, b in zip(results["sdk"], results["bare"], strict=True))
        ratio = ratios[len(ratios) // 2]
        cost = 1 - ratio
        verdict = "met" if cost <= 0.10 else "NOT met"
        sdk_us, bare_us = delivery_path_us()
        print(
            f"delivery path in-process (best of 12): SDK {sdk_us:.1f} us (verify off, dedup, deadline, validation "
            f"in and out, metrics, log fields), bare decode/encode {bare_us:.1f} us"
        )
        print(
            f"SDK throughput {ratio:.1%} of the bare app (median round): SDK costs {cost:.1%}; "
            f"target SDK costs <= 10 %: {verdict}"
        )
    finally:
        for process in agents.values():
            process.stop()
        stack.stop()


if __name__ == "__main__":
    main()
