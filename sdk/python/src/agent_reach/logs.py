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

from .tracing import trace_id_of

logger = logging.getLogger("agent_reach")

#: (traceparent, request_id, session_id) of the delivery being served, None outside one.
#: The trace id is taken from the traceparent only when a record is written.
_FIELDS: contextvars.ContextVar[tuple[str | None, str, str | None]] = contextvars.ContextVar(
    "agent_reach_request_fields", default=(None, "", None)
)

Token = contextvars.Token[tuple[str | None, str, str | None]]


def bind(traceparent: str | None, request_id: str, session_id: str | None) -> Token:
    """Sets the fields for the current context; pass the token to :func:`unbind`."""
    return _FIELDS.set((traceparent, request_id, session_id))


def unbind(token: Token) -> None:
    _FIELDS.reset(token)


def current() -> dict[str, str]:
    """The fields of the delivery being served (empty strings outside one)."""
    traceparent, request_id, session_id = _FIELDS.get()
    return {"trace_id": trace_id_of(traceparent) or "", "request_id": request_id, "session_id": session_id or ""}


class RequestFields(logging.Filter):
    """Adds ``trace_id``, ``request_id`` and ``session_id`` to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        traceparent, request_id, session_id = _FIELDS.get()
        # A record may carry its own (e.g. a log line written after the delivery ended).
        if not getattr(record, "request_id", ""):
            record.trace_id = trace_id_of(traceparent) or ""
            record.request_id = request_id
            record.session_id = session_id or ""
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
