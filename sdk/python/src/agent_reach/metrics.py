"""The agent's own Prometheus metrics on ``GET /metrics`` (text format 0.0.4).

``agent_reach_agent_requests_total{capability,code}`` (``code`` is ``OK`` or the
error code answered), ``agent_reach_agent_request_duration_seconds{capability}``
(histogram of handler time), ``agent_reach_agent_inflight`` and
``agent_reach_agent_status{status}`` (1 for the current one). Kept per agent rather
than in a global registry, so several agents in one process never mix their numbers.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dedup import Answer

BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STATUSES = ("starting", "ready", "busy", "overloaded", "draining")


class Metrics:
    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str], int] = defaultdict(int)
        # capability → (bucket counts, count, sum)
        self._durations: dict[str, list[float]] = {}

    def observe(self, capability: str, answer: Answer, seconds: float) -> None:
        self.requests[(capability, answer.code)] += 1
        histogram = self._durations.get(capability)
        if histogram is None:
            # len(BUCKETS) bucket counts (non-cumulative), then count, then sum.
            histogram = self._durations[capability] = [0.0] * (len(BUCKETS) + 2)
        index = bisect_left(BUCKETS, seconds)
        if index < len(BUCKETS):
            histogram[index] += 1
        histogram[-2] += 1
        histogram[-1] += seconds

    def render(self, inflight: int, status: str) -> str:
        lines = [
            "# HELP agent_reach_agent_requests_total Deliveries answered, by capability and code (OK or an error).",
            "# TYPE agent_reach_agent_requests_total counter",
        ]
        for (capability, code), count in sorted(self.requests.items()):
            lines.append(
                f'agent_reach_agent_requests_total{{capability="{_escape(capability)}",code="{_escape(code)}"}} {count}'
            )
        lines += [
            "# HELP agent_reach_agent_request_duration_seconds Time a delivery took to answer, by capability.",
            "# TYPE agent_reach_agent_request_duration_seconds histogram",
        ]
        for capability, histogram in sorted(self._durations.items()):
            label = f'capability="{_escape(capability)}"'
            cumulative = 0.0
            for bound, in_bucket in zip(BUCKETS, histogram, strict=False):
                cumulative += in_bucket
                lines.append(
                    f'agent_reach_agent_request_duration_seconds_bucket{{{label},le="{bound}"}} {cumulative:g}'
                )
            lines.append(f'agent_reach_agent_request_duration_seconds_bucket{{{label},le="+Inf"}} {histogram[-2]:g}')
            lines.append(f"agent_reach_agent_request_duration_seconds_count{{{label}}} {histogram[-2]:g}")
            lines.append(f"agent_reach_agent_request_duration_seconds_sum{{{label}}} {histogram[-1]}")
        lines += [
            "# HELP agent_reach_agent_inflight Deliveries being handled now.",
            "# TYPE agent_reach_agent_inflight gauge",
            f"agent_reach_agent_inflight {inflight}",
            "# HELP agent_reach_agent_status The status the agent reports (1 for the current one).",
            "# TYPE agent_reach_agent_status gauge",
        ]
        lines += [f'agent_reach_agent_status{{status="{name}"}} {int(name == status)}' for name in STATUSES]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
