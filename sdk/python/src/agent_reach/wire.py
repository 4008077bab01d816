"""The JSON shapes of the HTTP APIs (``proto/src/envelope.rs``, ``proto/src/http.rs``,
``proto/src/context_http.rs``), built and decoded in one place for the agent side
(:class:`~agent_reach.Ctx`) and the caller side (:class:`~agent_reach.Client`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx

from .errors import AgentReachError, RouterError, TransportError, router_error, service_error

ENVELOPE_VERSION = "1.0"


class Policy(StrEnum):
    """How the router picks an instance (``target_policy``).

    A policy plugged into the router is named by a plain string, ``"plugin:NAME"``.
    """

    WEIGHTED_ROUND_ROBIN = "weighted_round_robin"
    LEAST_CONNECTIONS = "least_connections"
    #: Keyed by ``session_id``: a conversation stays on one instance.
    CONSISTENT_HASH = "consistent_hash"
    #: Power of two choices on peak-EWMA latency x requests in flight.
    P2C_EWMA = "p2c_ewma"
    #: Weights learned from each instance's outcomes per hour of the day.
    ADAPTIVE = "adaptive"


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


def new_request_id() -> str:
    """A request id shaped as the router and the Rust SDK make them: the
    epoch milliseconds as 12 hex digits, then 16 random ones (the trail
    finds an id of that shape by its time, with no index write)."""
    return f"{time.time_ns() // 1_000_000 & 0xFFFFFFFFFFFF:012x}{os.urandom(8).hex()}"


@dataclass(frozen=True)
class InvokeResult:
    """A succeeded result envelope (DESIGN §3): the output and who produced it."""

    request_id: str
    capability: str
    capability_version: str
    agent_id: str
    attempts: int
    duration_ms: int
    output: Any
    envelope: dict[str, Any] = field(repr=False)
    #: What is left of the call's delegation budget once it (and all it caused) ended,
    #: ``{"calls_left"?, "cost_left"?}``, when it carried one (DESIGN §9).
    budget: dict[str, Any] | None = None


def invoke_body(
    capability: str,
    payload: Any,
    *,
    version: str | None = None,
    policy: Policy | str | None = None,
    timeout_ms: int | None = None,
    deadline_ms: int | None = None,
    session_id: str | None = None,
    context_id: str | None = None,
    request_id: str | None = None,
    priority: Priority | str | None = None,
) -> dict[str, Any]:
    """The ``POST /v1/invoke`` request envelope; absent options are left out (the router's defaults)."""
    body: dict[str, Any] = {
        "version": ENVELOPE_VERSION,
        "request_id": request_id or new_request_id(),
        "capability": capability,
        "payload": payload,
    }
    optional = {
        "capability_version": version,
        "target_policy": str(policy) if policy is not None else None,
        "timeout_ms": timeout_ms,
        "deadline": deadline_ms,
        "session_id": session_id,
        "context_id": context_id,
        "priority": str(priority) if priority is not None else None,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return body


def decode_json(response: httpx.Response, service: str) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TransportError(
            "INVALID_ANSWER",
            f"the {service} answered {response.status_code} with a body that is not JSON: {error}",
            status=response.status_code,
        ) from error


def invoke_result(response: httpx.Response) -> InvokeResult:
    """Decodes the router's result envelope; a failed one raises the typed :class:`RouterError`."""
    envelope = decode_json(response, "router")
    if not isinstance(envelope, dict) or envelope.get("status") not in ("succeeded", "failed"):
        raise TransportError(
            "INVALID_ANSWER",
            f"the router answered {response.status_code} without a result envelope",
            status=response.status_code,
        )
    if envelope["status"] == "failed":
        raise envelope_error(envelope, response.status_code)
    return InvokeResult(
        request_id=str(envelope.get("request_id", "")),
        capability=str(envelope.get("capability", "")),
        capability_version=str(envelope.get("capability_version", "")),
        agent_id=str(envelope.get("agent_id", "")),
        attempts=int(envelope.get("attempts", 0)),
        duration_ms=int(envelope.get("duration_ms", 0)),
        output=envelope.get("output"),
        envelope=envelope,
        budget=envelope["budget"] if isinstance(envelope.get("budget"), dict) else None,
    )


def envelope_error(envelope: dict[str, Any], status: int | None) -> RouterError:
    """The exception for a failed result envelope."""
    error = envelope.get("error") if isinstance(envelope.get("error"), dict) else {}
    assert isinstance(error, dict)  # narrowed above; keeps mypy precise
    details = error.get("details")
    return router_error(
        str(error.get("code", "INVALID_ANSWER")),
        str(error.get("message", "the router answered a failed envelope without an error")),
        status=status,
        retryable=bool(error.get("retryable", False)),
        details=details if isinstance(details, dict) else None,
        request_id=str(envelope.get("request_id", "")) or None,
        envelope=envelope,
    )


def router_answer(response: httpx.Response) -> dict[str, Any]:
    """A router JSON answer outside ``/v1/invoke`` (tasks, session results): the body,
    or the typed error of ``{"error": {code, message, retryable, details?}}``."""
    body = decode_json(response, "router")
    if response.is_success and isinstance(body, dict):
        return body
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "code" in error:
        raise envelope_error({"error": error}, response.status_code)
    raise TransportError(
        "INVALID_ANSWER",
        f"the router answered {response.status_code} with an unexpected body",
        status=response.status_code,
    )


def service_answer(response: httpx.Response, service: str) -> Any:
    """A registry or context answer: the decoded body, or the typed error it describes."""
    if response.status_code == 204:
        return None
    body = decode_json(response, service)
    if response.is_success:
        return body
    raise service_error(service, response.status_code, body)


def unreachable(service: str, url: str, error: Exception) -> AgentReachError:
    code = f"{service.upper()}_UNREACHABLE"
    return TransportError(code, f"cannot reach the {service} at {url}: {error!r}", retryable=True)


@dataclass(frozen=True)
class ContextView:
    """A context as read: the fields the reader may see and the version to patch against."""

    context_id: str
    version: int
    tier: str
    expires_at_ms: int
    fields: dict[str, Any]


def context_view(body: Any) -> ContextView:
    if not isinstance(body, dict):
        raise TransportError("INVALID_ANSWER", "the context service answered an unexpected body")
    fields = body.get("fields")
    return ContextView(
        context_id=str(body.get("context_id", "")),
        version=int(body.get("version", 0)),
        tier=str(body.get("tier", "")),
        expires_at_ms=int(body.get("expires_at", 0)),
        fields=fields if isinstance(fields, dict) else {},
    )


def patch_body(set_fields: dict[str, Any] | None, delete: list[str] | None, if_version: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if set_fields:
        body["set"] = set_fields
    if delete:
        body["delete"] = list(delete)
    if if_version is not None:
        body["if_version"] = if_version
    return body
