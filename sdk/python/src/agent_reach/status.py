"""The status an agent reports (registry ``can_become`` rules, ``registry/src/model.rs``).

``starting`` (registered, not routable) → ``ready`` (after ``mark_ready``) ↔ ``busy`` /
``overloaded`` → ``draining`` (final; the instance then deregisters). Only ``ready``
and ``busy`` instances are routable; ``overloaded`` gets traffic only when nothing
else is left. Load is reported two ways, and the heavier wins: by the SDK itself,
from in-flight deliveries against the concurrency limit (:class:`LoadThresholds`),
and by the application through ``Agent.report_load``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    OVERLOADED = "overloaded"
    DRAINING = "draining"


_LOAD_RANK = {Status.READY: 0, Status.BUSY: 1, Status.OVERLOADED: 2}


@dataclass(frozen=True)
class LoadThresholds:
    """Fractions of ``max_concurrency`` in flight at which the SDK reports itself
    ``busy`` and ``overloaded`` (the router sends ``overloaded`` instances traffic only
    when nothing else is left)."""

    busy: float = 0.75
    overloaded: float = 0.95

    def at(self, max_concurrency: int) -> tuple[int, int]:
        """The in-flight counts at which ``busy`` and ``overloaded`` begin for this limit:
        ``ceil(max * fraction)`` in whole thousandths (so 0.07 * 100 is 7), each at least 1,
        busy never above overloaded; the Rust SDK's ``LoadThresholds::at``.

        >>> LoadThresholds().at(256)
        (192, 244)
        >>> LoadThresholds(busy=0.5, overloaded=1.0).at(4)
        (2, 4)
        """

        def begins(fraction: float) -> int:
            permille = min(1000, max(0, round(fraction * 1000)))
            return max(1, -(-max_concurrency * permille // 1000))

        busy = begins(self.busy)
        return busy, max(busy, begins(self.overloaded))

    def problems(self) -> list[str]:
        if not 0 < self.busy <= self.overloaded <= 1:
            return [f"load thresholds need 0 < busy ({self.busy}) <= overloaded ({self.overloaded}) <= 1"]
        return []


class StatusTracker:
    """The lifecycle phase, the application's reported load and the SDK's own load → one status."""

    def __init__(self, max_concurrency: int, thresholds: LoadThresholds) -> None:
        self.phase = Status.STARTING
        self.reported: Status | None = None
        # In-flight counts at which each automatic status begins.
        self.busy_at, self._overloaded_at = thresholds.at(max_concurrency)

    def current(self, inflight: int) -> Status:
        if self.phase is not Status.READY:
            return self.phase
        automatic = (
            Status.OVERLOADED
            if inflight >= self._overloaded_at
            else Status.BUSY
            if inflight >= self.busy_at
            else Status.READY
        )
        if self.reported is None or _LOAD_RANK[automatic] >= _LOAD_RANK[self.reported]:
            return automatic
        return self.reported

    def accepts_traffic(self) -> bool:
        return self.phase is Status.READY
