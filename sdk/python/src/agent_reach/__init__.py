"""Agent-Reach for Python: plain functions become capability handlers that register
themselves, stay alive, serve the router, call other capabilities and share session
context.

.. code-block:: python

    from pydantic import BaseModel
    from agent_reach import Agent, Ctx

    class Text(BaseModel):
        text: str

    class Summary(BaseModel):
        summary: str

    agent = Agent("summarizer", endpoint="http://10.0.0.12:8000", listen="0.0.0.0:8000")

    @agent.handler("text.summarize", version="2.0.0", timeout_ms=15000)
    async def summarize(payload: Text, ctx: Ctx) -> Summary:
        return Summary(summary=payload.text[:100])

    agent.run()   # registers, serves, heartbeats; SIGTERM drains and deregisters
"""

from .access import AccessRequest
from .agent import Agent
from .assertion import Assertion, JwksFile, JwksUrl
from .client import AsyncClient, Client, SessionResults, TaskAccepted, TaskView, verify_callback
from .contexts import ContextHandle, Contexts
from .ctx import Ctx, Turn
from .errors import (
    AgentError,
    AgentReachError,
    AllRetriesExhausted,
    CapabilityNotFound,
    ConfigError,
    ContextCode,
    ContextError,
    ContextNotFound,
    DeadlineExceeded,
    Forbidden,
    HandlerDefinitionError,
    HandlerError,
    InputRequired,
    InvalidEnvelope,
    LeaseExpired,
    NoAvailableInstance,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RegistrationRefused,
    RegistryCode,
    RegistryError,
    RouterCode,
    RouterError,
    SchemaMismatch,
    TaskNotFound,
    TasksDisabled,
    TransportError,
    Unauthenticated,
    VersionConflict,
    VersionNotFound,
)
from .handlers import Descriptor
from .status import LoadThresholds, Status
from .wire import ContextView, InvokeResult, Policy, Priority

__version__ = "0.1.0"

__all__ = [
    "AccessRequest",
    "Agent",
    "AgentError",
    "AgentReachError",
    "AllRetriesExhausted",
    "Assertion",
    "AsyncClient",
    "CapabilityNotFound",
    "Client",
    "ConfigError",
    "ContextCode",
    "ContextError",
    "ContextHandle",
    "ContextNotFound",
    "ContextView",
    "Contexts",
    "Ctx",
    "DeadlineExceeded",
    "Descriptor",
    "Forbidden",
    "HandlerDefinitionError",
    "HandlerError",
    "InputRequired",
    "InvalidEnvelope",
    "InvokeResult",
    "JwksFile",
    "JwksUrl",
    "LeaseExpired",
    "LoadThresholds",
    "NoAvailableInstance",
    "Overloaded",
    "PayloadTooLarge",
    "Policy",
    "Priority",
    "RateLimited",
    "RegistrationRefused",
    "RegistryCode",
    "RegistryError",
    "RouterCode",
    "RouterError",
    "SchemaMismatch",
    "SessionResults",
    "Status",
    "TaskAccepted",
    "TaskNotFound",
    "TaskView",
    "TasksDisabled",
    "TransportError",
    "Turn",
    "Unauthenticated",
    "VersionConflict",
    "VersionNotFound",
    "verify_callback",
]
