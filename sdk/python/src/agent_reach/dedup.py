"""Request deduplication by ``request_id``: a repeat gets the first answer, a
concurrent repeat waits for it. Bounded in size and age (as the Rust SDK's)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """A finished answer: HTTP status and JSON body."""

    status: int
    body: bytes


class Dedup:
    """request_id → the future of its answer, oldest first."""

    def __init__(self, capacity: int = 10_000, ttl_s: float = 600.0) -> None:
        self.capacity = max(1, capacity)
        self.ttl_s = ttl_s
        # A plain dict keeps insertion order: its first key is the oldest.
        self._slots: dict[str, tuple[float, asyncio.Future[Answer]]] = {}

    def slot(self, request_id: str) -> tuple[asyncio.Future[Answer], bool]:
        """The answer's future for ``request_id`` and whether this call created it (then it must set it)."""
        now = time.monotonic()
        slots = self._slots
        existing = slots.get(request_id)
        if existing is not None:
            return existing[1], False
        # Oldest first: drop what is too old or beyond capacity (mostly one per insert, amortised).
        while slots:
            oldest_id = next(iter(slots))
            if now - slots[oldest_id][0] < self.ttl_s and len(slots) < self.capacity:
                break
            del slots[oldest_id]
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        slots[request_id] = (now, future)
        return future, True

    def forget(self, request_id: str) -> None:
        """Drops a slot whose delivery ended without an answer worth repeating."""
        self._slots.pop(request_id, None)
