"""The registries an agent talks to, in order, and which one it uses now (the Rust SDK's
``sdk/src/registries.rs``): every failure (a refused or unanswered registration, a failed
heartbeat) moves to the next. They share one etcd, so a lease granted through one is
renewed through any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from .logs import logger


def parse_registries(value: str | Sequence[str] | None) -> list[str]:
    """``"http://r1:7400,http://r2:7400"`` (as ``AGENT_REACH_REGISTRY`` holds it) or a list of URLs,
    trimmed, empty entries dropped, trailing slashes removed."""
    if value is None:
        return []
    parts = value.split(",") if isinstance(value, str) else list(value)
    return [part.strip().rstrip("/") for part in parts if part.strip()]


class Registries:
    """The registry URLs, one in use at a time; :meth:`failed` moves to the next."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("at least one registry URL is needed")
        self.urls = list(urls)
        self._current = 0

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def current(self) -> str:
        """The registry in use."""
        return self.urls[self._current]

    def failed(self) -> None:
        """The registry in use failed: the next request goes to the next one."""
        if len(self.urls) < 2:
            return
        before = self.current
        self._current = (self._current + 1) % len(self.urls)
        logger.warning("Registry failed; moving to the next one.", extra={"failed": before, "next": self.current})
