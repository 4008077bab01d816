"""Request fields on every log record: ``trace_id``, ``request_id``, ``session_id``.

While a delivery is served, these three are held in a context variable, so they
follow the handler into every ``await`` and into the worker thread of a sync
handler. :class:`RequestFields` copies them onto each record of the ``agent_reach``
logger (installed by the SDK) and of any logger you attach it to;
:class:`JsonFormatter` writes one JSON object per line with them at the top level::

    handler = logging.StreamHandler()
    handler.addFilter(agent_reach.logs.RequestFields())
    handler.setFormatter(agent_reach.logs.JsonFormatter())
    logging.getLogger().addHandler(handler)
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from typing import Any

logger = logging.getLogger("agent_reach")

#: (trace_id, request_id, session_id) of the delivery being served, empty outside one.
_FIELDS: contextvars.ContextVar[tuple[str, str, str]] = contextvars.ContextVar(
    "agent_reach_request_fields", default=("", "", "")
)

FIELD_NAMES = ("trace_id", "request_id", "session_id")


def bind(trace_id: str, request_id: str, session_id: str) -> contextvars.Token[tuple[str, str, str]]:
    """Sets the fields for the current context; pass the token to :func:`unbind`."""
    return _FIELDS.set((trace_id, request_id, session_id))


def unbind(token: contextvars.Token[tuple[str, str, str]]) -> None:
    _FIELDS.reset(token)


def current() -> dict[str, str]:
    """The fields of the delivery being served (empty strings outside one)."""
    return dict(zip(FIELD_NAMES, _FIELDS.get(), strict=True))


class RequestFields(logging.Filter):
    """Adds ``trace_id``, ``request_id`` and ``session_id`` to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id, request_id, session_id = _FIELDS.get()
        # A record may carry its own (e.g. a log line written after the delivery ended).
        if not getattr(record, "request_id", ""):
            record.trace_id = trace_id
            record.request_id = request_id
            record.session_id = session_id
        return True


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the request fields and any ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                out[name] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def install() -> None:
    """Puts :class:`RequestFields` on the SDK's logger once, so its records always carry the fields."""
    if not any(isinstance(existing, RequestFields) for existing in logger.filters):
        logger.addFilter(RequestFields())
