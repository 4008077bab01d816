"""Typed exceptions carrying the services' stable error codes.

Every failure the SDK reports is an :class:`AgentReachError` with ``code`` (the
stable, upper-case code the service answered, e.g. ``SCHEMA_MISMATCH``),
``message`` (what to do about it), ``status`` (the HTTP status, when one was
received), ``retryable`` and ``details``. Each service has its own base class
(:class:`RouterError`, :class:`RegistryError`, :class:`ContextError`) and the
codes callers usually branch on have a class of their own, so both styles work::

    try:
        result = await client.invoke("order.query", {"order_id": "SO-1"})
    except SchemaMismatch as error:      # by class
        print(error.details)
    except RouterError as error:         # by code
        if error.code == "NO_AVAILABLE_INSTANCE": ...

The code lists mirror ``router/src/error.rs``, ``registry/src/error.rs`` and
``context/src/error.rs``; the string forms are part of the API.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class RouterCode(StrEnum):
    """Codes of the router's failed result envelopes (DESIGN §3, §8)."""

    INVALID_ENVELOPE = "INVALID_ENVELOPE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    CAPABILITY_NOT_FOUND = "CAPABILITY_NOT_FOUND"
    VERSION_NOT_FOUND = "VERSION_NOT_FOUND"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    SCHEMA_MISMATCH = "SCHEMA_MISMATCH"
    OVERLOADED = "OVERLOADED"
    RATE_LIMITED = "RATE_LIMITED"
    AGENT_ERROR = "AGENT_ERROR"
    ALL_RETRIES_EXHAUSTED = "ALL_RETRIES_EXHAUSTED"
    NO_AVAILABLE_INSTANCE = "NO_AVAILABLE_INSTANCE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    TASKS_DISABLED = "TASKS_DISABLED"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    TASK_CONFLICT = "TASK_CONFLICT"
    INVALID_TASK_RESULT = "INVALID_TASK_RESULT"
    DEAD_LETTER_NOT_FOUND = "DEAD_LETTER_NOT_FOUND"
    TASK_STORE_UNAVAILABLE = "TASK_STORE_UNAVAILABLE"
    TASK_BUFFER_FULL = "TASK_BUFFER_FULL"
    STREAM_INTERRUPTED = "STREAM_INTERRUPTED"
    INVALID_CALLBACK = "INVALID_CALLBACK"
    CANCELED = "CANCELED"
    WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    RUN_CONFLICT = "RUN_CONFLICT"
    STEP_FAILED = "STEP_FAILED"
    TRAIL_DISABLED = "TRAIL_DISABLED"
    DEPTH_EXCEEDED = "DEPTH_EXCEEDED"
    LOOP_DETECTED = "LOOP_DETECTED"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"


class RegistryCode(StrEnum):
    """Codes of the registry's error answers."""

    MALFORMED_JSON = "MALFORMED_JSON"
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD_TYPE = "INVALID_FIELD_TYPE"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INVALID_AGENT_ID = "INVALID_AGENT_ID"
    INVALID_NAME = "INVALID_NAME"
    INVALID_ENDPOINT = "INVALID_ENDPOINT"
    INVALID_PROTOCOL = "INVALID_PROTOCOL"
    INVALID_WEIGHT = "INVALID_WEIGHT"
    INVALID_TTL = "INVALID_TTL"
    INVALID_STATUS = "INVALID_STATUS"
    INVALID_TAGS = "INVALID_TAGS"
    NO_CAPABILITIES = "NO_CAPABILITIES"
    INVALID_CAPABILITY_NAME = "INVALID_CAPABILITY_NAME"
    INVALID_VERSION = "INVALID_VERSION"
    INVALID_VERSION_REQ = "INVALID_VERSION_REQ"
    INVALID_SCHEMA = "INVALID_SCHEMA"
    SCHEMA_TOO_LARGE = "SCHEMA_TOO_LARGE"
    SCHEMA_TOO_DEEP = "SCHEMA_TOO_DEEP"
    INVALID_TIMEOUT = "INVALID_TIMEOUT"
    DUPLICATE_CAPABILITY = "DUPLICATE_CAPABILITY"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    AGENT_ID_TAKEN = "AGENT_ID_TAKEN"
    AGENT_NOT_FOUND = "AGENT_NOT_FOUND"
    CAPABILITY_NOT_FOUND = "CAPABILITY_NOT_FOUND"
    VERSION_NOT_FOUND = "VERSION_NOT_FOUND"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    INVALID_STATUS_TRANSITION = "INVALID_STATUS_TRANSITION"
    INVALID_ACCESS_REQUEST = "INVALID_ACCESS_REQUEST"
    ACCESS_REQUEST_NOT_FOUND = "ACCESS_REQUEST_NOT_FOUND"
    GRANT_NOT_FOUND = "GRANT_NOT_FOUND"
    ALREADY_ALLOWED = "ALREADY_ALLOWED"
    ALREADY_DECIDED = "ALREADY_DECIDED"
    NO_OWNER = "NO_OWNER"
    CONFLICT = "CONFLICT"
    NOT_FOUND = "NOT_FOUND"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    INTERNAL = "INTERNAL"


class ContextCode(StrEnum):
    """Codes of the context service's error answers."""

    MALFORMED_JSON = "MALFORMED_JSON"
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD_TYPE = "INVALID_FIELD_TYPE"
    UNKNOWN_FIELD = "UNKNOWN_FIELD"
    INVALID_QUERY = "INVALID_QUERY"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INVALID_CONTEXT_ID = "INVALID_CONTEXT_ID"
    INVALID_TIER = "INVALID_TIER"
    INVALID_FIELD_NAME = "INVALID_FIELD_NAME"
    INVALID_FIELD_VALUE = "INVALID_FIELD_VALUE"
    EMPTY_PATCH = "EMPTY_PATCH"
    CONFLICTING_PATCH = "CONFLICTING_PATCH"
    FIELD_TOO_LARGE = "FIELD_TOO_LARGE"
    TOO_MANY_FIELDS = "TOO_MANY_FIELDS"
    CONTEXT_TOO_LARGE = "CONTEXT_TOO_LARGE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    CONTEXT_NOT_FOUND = "CONTEXT_NOT_FOUND"
    CONTEXT_EXISTS = "CONTEXT_EXISTS"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    NOT_FOUND = "NOT_FOUND"
    CONTEXT_STORE_UNAVAILABLE = "CONTEXT_STORE_UNAVAILABLE"
    INTERNAL = "INTERNAL"


class AgentReachError(Exception):
    """A failure with a stable code. Base of every exception the SDK raises for a service answer."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retryable = retryable
        self.details = details or {}


class TransportError(AgentReachError):
    """A service could not be reached or answered something that is not its API.

    Codes: ``ROUTER_UNREACHABLE``, ``REGISTRY_UNREACHABLE``, ``CONTEXT_UNREACHABLE``
    (connection or timeout; retryable) and ``INVALID_ANSWER`` (an unreadable body).
    """


class ConfigError(AgentReachError, ValueError):
    """An agent or client was configured wrongly; the message lists every problem at once."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("INVALID_CONFIG", "; ".join(problems))


class HandlerDefinitionError(AgentReachError, TypeError):
    """A handler cannot be registered as written (signature, types, schema, name or version).

    Raised when the decorator runs, i.e. at import, so a broken agent never starts.
    The message names the function and the capability.
    """

    def __init__(self, handler: str, capability: str, problem: str) -> None:
        self.handler = handler
        self.capability = capability
        super().__init__("INVALID_HANDLER", f"handler `{handler}` for `{capability}`: {problem}")


# === Router ===


class RouterError(AgentReachError):
    """A failed result envelope from the router (``status: "failed"``)."""

    code_class: ClassVar[str | None] = None

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
        request_id: str | None = None,
        envelope: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message, status=status, retryable=retryable, details=details)
        self.request_id = request_id
        # The whole failed result envelope (agent_id, attempts, duration_ms), when there was one.
        self.envelope = envelope or {}


class InvalidEnvelope(RouterError):
    code_class = RouterCode.INVALID_ENVELOPE


class Unauthenticated(RouterError):
    code_class = RouterCode.UNAUTHENTICATED


class Forbidden(RouterError):
    code_class = RouterCode.FORBIDDEN


class CapabilityNotFound(RouterError):
    code_class = RouterCode.CAPABILITY_NOT_FOUND


class VersionNotFound(RouterError):
    code_class = RouterCode.VERSION_NOT_FOUND


class PayloadTooLarge(RouterError):
    code_class = RouterCode.PAYLOAD_TOO_LARGE


class SchemaMismatch(RouterError):
    """The payload does not match the capability's input schema; ``details`` name the JSON pointers."""

    code_class = RouterCode.SCHEMA_MISMATCH


class Overloaded(RouterError):
    code_class = RouterCode.OVERLOADED


class RateLimited(RouterError):
    code_class = RouterCode.RATE_LIMITED


class AgentError(RouterError):
    """The agent's own business error, passed through and never retried.

    ``agent_code`` and ``agent_status`` are the code and status the agent answered.
    """

    code_class = RouterCode.AGENT_ERROR

    @property
    def agent_code(self) -> str:
        return str(self.details.get("agent_code", ""))

    @property
    def agent_status(self) -> int | None:
        status = self.details.get("agent_status")
        return status if isinstance(status, int) else None


class AllRetriesExhausted(RouterError):
    code_class = RouterCode.ALL_RETRIES_EXHAUSTED


class NoAvailableInstance(RouterError):
    code_class = RouterCode.NO_AVAILABLE_INSTANCE


class DeadlineExceeded(RouterError):
    code_class = RouterCode.DEADLINE_EXCEEDED


class TaskNotFound(RouterError):
    code_class = RouterCode.TASK_NOT_FOUND


class TasksDisabled(RouterError):
    code_class = RouterCode.TASKS_DISABLED


_ROUTER_CLASSES: dict[str, type[RouterError]] = {
    cls.code_class: cls
    for cls in (
        InvalidEnvelope,
        Unauthenticated,
        Forbidden,
        CapabilityNotFound,
        VersionNotFound,
        PayloadTooLarge,
        SchemaMismatch,
        Overloaded,
        RateLimited,
        AgentError,
        AllRetriesExhausted,
        NoAvailableInstance,
        DeadlineExceeded,
        TaskNotFound,
        TasksDisabled,
    )
    if cls.code_class is not None
}


def router_error(
    code: str,
    message: str,
    *,
    status: int | None,
    retryable: bool,
    details: dict[str, Any] | None,
    request_id: str | None = None,
    envelope: dict[str, Any] | None = None,
) -> RouterError:
    """The most specific :class:`RouterError` subclass for ``code``."""
    cls = _ROUTER_CLASSES.get(code, RouterError)
    return cls(
        code,
        message,
        status=status,
        retryable=retryable,
        details=details,
        request_id=request_id,
        envelope=envelope,
    )


# === Registry ===


class RegistryError(AgentReachError):
    """An error answer of the registry; ``field`` is the request field at fault, when named."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(code, message, status=status, retryable=retryable, details=details)
        self.field = field


class LeaseExpired(RegistryError):
    """The instance's lease is gone; the SDK registers again by itself."""


class RegistrationRefused(RegistryError):
    """The registry refused to register the agent; raised by ``Agent.start``.

    ``handler`` names the handler whose capability is at fault, when the registry named one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        field: str | None = None,
        handler: str | None = None,
    ) -> None:
        super().__init__(code, message, status=status, field=field)
        self.handler = handler


# === Context ===


class ContextError(AgentReachError):
    """An error answer of the context service; ``field`` is the request field at fault, when named."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(code, message, status=status, retryable=retryable, details=details)
        self.field = field


class VersionConflict(ContextError):
    """A conditional patch found another version; re-read and retry. ``current_version`` is it."""

    @property
    def current_version(self) -> int | None:
        version = self.details.get("current_version")
        return version if isinstance(version, int) else None


class ContextNotFound(ContextError):
    """No such context: never created, closed, expired or swept as idle."""


def service_error(service: str, status: int, body: Any) -> AgentReachError:
    """Decodes a registry or context error body ``{"error": {code, message, field?, details?}}``."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return TransportError(
            "INVALID_ANSWER",
            f"the {service} answered {status} without an error body",
            status=status,
        )
    code = str(error["code"])
    message = str(error.get("message", ""))
    field = error.get("field") if isinstance(error.get("field"), str) else None
    details = error.get("details") if isinstance(error.get("details"), dict) else None
    retryable = status >= 500
    if service == "registry":
        cls: type[RegistryError] = LeaseExpired if code == RegistryCode.LEASE_EXPIRED else RegistryError
        return cls(code, message, status=status, retryable=retryable, details=details, field=field)
    context_cls: type[ContextError] = ContextError
    if code == ContextCode.VERSION_CONFLICT:
        context_cls = VersionConflict
    elif code == ContextCode.CONTEXT_NOT_FOUND:
        context_cls = ContextNotFound
    return context_cls(code, message, status=status, retryable=retryable, details=details, field=field)


# === Handlers ===


class HandlerError(Exception):
    """A handler's business error: the router gives the caller ``AGENT_ERROR`` with this
    status and code and never retries it, except :meth:`unavailable` (503), which makes
    the router try another instance.

    >>> raise HandlerError("ORDER_NOT_FOUND", "no order SO-1")            # doctest: +SKIP
    >>> raise HandlerError("GONE", "archived", status=410)                # doctest: +SKIP
    """

    def __init__(self, code: str, message: str, *, status: int = 422) -> None:
        super().__init__(f"{code} ({status}): {message}")
        self.code = code
        self.message = message
        self.status = status if 400 <= status <= 599 else 500

    @classmethod
    def unavailable(cls, message: str) -> HandlerError:
        """ "Not now": the router retries on another instance (503)."""
        return cls("UNAVAILABLE", message, status=503)

    @classmethod
    def invalid_input(cls, message: str) -> HandlerError:
        """The input is unusable for a reason the schema cannot say (400)."""
        return cls("INVALID_INPUT", message, status=400)


class InputRequired(HandlerError):
    """Asks for more input (docs/design.md, "Multi-turn tasks"): the handler cannot answer
    until the caller says more; ``message`` says what it needs. Answered 422 with the code
    ``INPUT_REQUIRED``: an A2A task goes ``input-required`` with ``message`` as its status
    message, and the caller's next message naming the task is delivered with the
    conversation so far (:attr:`Ctx.history`). A plain ``/v1/invoke`` caller gets it as
    ``AGENT_ERROR`` (``details["agent_code"]``).

    >>> raise InputRequired("Which size: S, M or L?")                    # doctest: +SKIP
    """

    def __init__(self, message: str) -> None:
        super().__init__("INPUT_REQUIRED", message)
