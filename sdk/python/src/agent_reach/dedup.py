"""Request deduplication by ``request_id``: a repeat gets the first answer, a
concurrent repeat waits for it. Bounded in size and age (as the Rust SDK's)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import NamedTuple


class Answer(NamedTuple):
    """A finished answer: HTTP status, JSON body, and its code (``OK`` or the error's) for metrics."""

    status: int
    body: bytes
    code: str


class Dedup:
    """request_id → the future of its answer, plus the ids oldest first.

    The order lives in a deque rather than in the dict: a dict whose oldest keys keep
    being deleted makes ``next(iter(d))`` walk over the deleted slots, an O(n) scan on
    every request once the table is full.
    """

    def __init__(self, capacity: int = 10_000, ttl_s: float = 600.0) -> None:
        self.capacity = max(1, capacity)
        self.ttl_s = ttl_s
        self._slots: dict[str, asyncio.Future[Answer]] = {}
        self._order: deque[tuple[float, str, asyncio.Future[Answer]]] = deque()

    def slot(self, request_id: str) -> tuple[asyncio.Future[Answer], bool]:
        """The answer's future for ``request_id`` and whether this call created it (then it must set it)."""
        slots = self._slots
        existing = slots.get(request_id)
        if existing is not None:
            return existing, False
        now = time.monotonic()
        order = self._order
        while order and (len(order) >= self.capacity or now - order[0][0] >= self.ttl_s):
            _, oldest, its_future = order.popleft()
            # Only if the slot is still that entry's (a forgotten id may have come back since).
            if slots.get(oldest) is its_future:
                del slots[oldest]
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        slots[request_id] = future
        order.append((now, request_id, future))
        return future, True

    def forget(self, request_id: str) -> None:
        """Drops a slot whose delivery ended without an answer worth repeating (its
        entry in the order goes when it comes up)."""
        self._slots.pop(request_id, None)
