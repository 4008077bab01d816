"""Access requests from an agent (DESIGN §2.11): at start-up an agent asks to call a
capability ``acl.yaml`` does not let it call yet; an approver named under ``owners:``
decides, and once approved every router lets the calls through, with nothing restarted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from .errors import AgentReachError, RegistryError
from .logs import logger
from .wire import service_answer, unreachable


@dataclass(frozen=True)
class AccessRequest:
    """Where an agent's access to a capability stands after :meth:`Agent.request_access`.

    ``status`` is ``"allowed"`` (acl.yaml or a live grant already lets it call) or
    ``"pending"`` (filed now, or earlier and not yet decided: ``id``, and who may approve).
    """

    status: Literal["pending", "allowed"]
    id: str | None = None
    approvers: list[str] = field(default_factory=list)


async def request_access(
    registries: Sequence[str],
    token: str | None,
    verify: Any,
    *,
    capability: str,
    reason: str,
    ttl_s: int | None = None,
) -> AccessRequest:
    """``POST /v1/access-requests`` on the first registry that answers (they share one etcd)."""
    body: dict[str, Any] = {"capability": capability, "reason": reason}
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    headers = {"authorization": f"Bearer {token}"} if token else {}
    failure: AgentReachError = unreachable("registry", ", ".join(registries) or "(none)", ValueError("no registry"))
    async with httpx.AsyncClient(verify=verify, timeout=10.0) as http:
        for registry in registries:
            url = f"{registry}/v1/access-requests"
            try:
                response = await http.post(url, json=body, headers=headers)
            except httpx.HTTPError as error:
                failure = unreachable("registry", registry, error)
                continue
            try:
                answer = service_answer(response, "registry")
            except RegistryError as error:
                if error.code == "ALREADY_ALLOWED":
                    return AccessRequest(status="allowed")
                if not error.retryable:
                    raise
                failure = error
                continue
            approvers = [str(name) for name in answer.get("approvers") or []]
            logger.info(
                "Access requested.",
                extra={"capability": capability, "request_id": answer["id"], "approvers": ",".join(approvers)},
            )
            return AccessRequest(status="pending", id=str(answer["id"]), approvers=approvers)
    raise failure
