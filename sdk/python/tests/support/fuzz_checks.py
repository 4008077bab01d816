"""Schemathesis checks of the router's own contract, loaded by the fuzz test
(``SCHEMATHESIS_HOOKS=tests.support.fuzz_checks``, see tests/test_router_api.py)."""

from __future__ import annotations

import schemathesis


@schemathesis.check
def gateway_timeouts_are_deadlines(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """A 504 answers a caller's deadline (DESIGN §3: "a deadline already past is
    DEADLINE_EXCEEDED", and so is one that runs out), either the router's own or an agent's
    504 passed through as AGENT_ERROR (§3.5, §3.8); never a fault of the router's. The fuzz test
    lets `not_a_server_error` pass a 504 only because this check holds."""
    if response.status_code != 504:
        return None
    error = response.json().get("error", {})
    code, agent_status = error.get("code"), error.get("details", {}).get("agent_status")
    if code != "DEADLINE_EXCEEDED" and (code, agent_status) != ("AGENT_ERROR", 504):
        raise AssertionError(f"504 with code {code!r}: a 504 is DEADLINE_EXCEEDED or an agent's own 504")
    return None
