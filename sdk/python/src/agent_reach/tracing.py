"""W3C Trace Context in and out, through OpenTelemetry when it is installed and configured.

Without OpenTelemetry (or with its default no-op provider) the SDK still keeps one
trace across hops: an outgoing call carries the incoming trace id with a fresh span
id, as the Rust SDK does. With a configured ``TracerProvider`` each delivery is a
server span continuing the router's ``traceparent`` and each call a client span, so
the exporter the application set up sees the agent inside the trace.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE = "0" * 32
_HEX = frozenset("0123456789abcdef")


def _is_lower_hex(text: str) -> bool:
    return _HEX.issuperset(text)


try:  # OpenTelemetry is optional: no hard dependency.
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised only without the package
    otel_trace = None  # type: ignore[assignment]
    otel_context = None  # type: ignore[assignment]
    _PROPAGATOR = None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a valid ``traceparent`` header, else None."""
    if not traceparent:
        return None
    # The common case, checked cheaply: version 00, 55 characters, lowercase hex ids.
    if len(traceparent) == 55 and traceparent.startswith("00-") and traceparent[35] == "-":
        trace = traceparent[3:35]
        if trace != _ZERO_TRACE and _is_lower_hex(trace):
            return trace
    match = _TRACEPARENT.match(traceparent.strip())
    if match is None or match.group(2) == "0" * 32:
        return None
    return match.group(2)


def new_traceparent(trace_id: str | None = None) -> str:
    """A ``traceparent`` with a fresh span id, in ``trace_id`` (or a new trace), sampled."""
    trace = trace_id or os.urandom(16).hex()
    return f"00-{trace}-{os.urandom(8).hex()}-01"


def child_traceparent(parent: str | None) -> str:
    """The header for an outgoing call made while serving ``parent``: same trace, new span."""
    current = _otel_current()
    if current is not None:
        return current
    return new_traceparent(trace_id_of(parent))


def otel_active() -> bool:
    """Whether a real OpenTelemetry tracer provider is configured (not the default no-op)."""
    if otel_trace is None:
        return False
    provider = otel_trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


#: ``gen_ai.provider.name`` on the SDK's spans, as on the router's.
GEN_AI_PROVIDER = "agent_reach"


@contextlib.contextmanager
def server_span(
    traceparent: str | None, capability: str, agent_id: str, session_id: str | None, attributes: dict[str, str]
) -> Iterator[Any]:
    """An ``invoke_agent {capability}`` server span (the OpenTelemetry GenAI conventions'
    name and ``gen_ai.*`` attributes, ours beside them) continuing ``traceparent`` while the
    handler runs; yields the span (None without OpenTelemetry) for :func:`record_usage`."""
    if not otel_active() or otel_trace is None or otel_context is None:
        yield None
        return
    carrier = {"traceparent": traceparent} if traceparent else {}
    parent = _PROPAGATOR.extract(carrier)
    tracer = otel_trace.get_tracer("agent_reach")
    gen_ai = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": GEN_AI_PROVIDER,
        "gen_ai.agent.name": capability,
        "gen_ai.agent.id": agent_id,
    }
    if session_id:
        gen_ai["gen_ai.conversation.id"] = session_id
    with tracer.start_as_current_span(
        f"invoke_agent {capability}",
        context=parent,
        kind=otel_trace.SpanKind.SERVER,
        attributes={**gen_ai, "capability": capability, "agent_id": agent_id, **attributes},
    ) as span:
        yield span


def record_usage(span: Any, usage: dict[str, Any] | None) -> None:
    """The usage a handler reported (``ctx.report_usage``) on its span, under the GenAI names."""
    if span is None or not usage:
        return
    for key, attribute in (
        ("input_tokens", "gen_ai.usage.input_tokens"),
        ("output_tokens", "gen_ai.usage.output_tokens"),
        ("model", "gen_ai.request.model"),
    ):
        if usage.get(key) is not None:
            span.set_attribute(attribute, usage[key])


@contextlib.contextmanager
def client_span(name: str, attributes: dict[str, str]) -> Iterator[None]:
    """A client span around an outgoing call (no-op without OpenTelemetry)."""
    if not otel_active() or otel_trace is None:
        yield
        return
    tracer = otel_trace.get_tracer("agent_reach")
    with tracer.start_as_current_span(name, kind=otel_trace.SpanKind.CLIENT, attributes=attributes):
        yield


def _otel_current() -> str | None:
    if not otel_active() or _PROPAGATOR is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")
