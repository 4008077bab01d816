"""``Agent.request_access`` against the real registry and router (issue 39, point 3;
DESIGN §2.11): an agent asks at start-up to call a capability acl.yaml does not let it
call; asking again answers the same pending request; once an owner approves, it is
allowed and its calls go through the router; bad input raises the registry's code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from agent_reach import AccessRequest, Agent, RegistryError

from .conftest import make_agent
from .support.stack import Stack, wait_until


def test_an_agent_asks_at_start_up_and_is_allowed_once_approved(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack, "asker", agent_id="asker-1")

    @agent.handler("test.asked")
    def echo(payload: dict[str, str]) -> dict[str, str]:
        return payload

    start_agent(agent)
    # At start-up (here: once registered, its own capability exists; with run() or serve(),
    # in an on_start hook) the agent asks for what acl.yaml does not let it call.
    asked = asyncio.run(agent.request_access("test.asked", "asker calls itself in tests", ttl_s=3600))
    assert asked.status == "pending", asked
    assert asked.approvers == ["owner"]
    request_id = asked.id
    again = asyncio.run(agent.request_access("test.asked", "restarted"))
    assert again == AccessRequest(status="pending", id=request_id, approvers=["owner"])
    assert invoke("test.asked", {"n": "1"}, caller="asker").json()["error"]["code"] == "FORBIDDEN"

    approved = httpx.post(
        f"{stack.registry.url}/v1/access-requests/{request_id}/approve",
        headers={"authorization": f"Bearer {stack.token('owner')}"},
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["decided_by"] == "owner"
    assert asyncio.run(agent.request_access("test.asked", "once more")) == AccessRequest(status="allowed")
    wait_until(lambda: invoke("test.asked", {"n": "2"}, caller="asker").status_code == 200, 5, "the call allowed")

    with pytest.raises(RegistryError) as missing:
        asyncio.run(agent.request_access("test.nothing", "r"))
    assert (missing.value.code, missing.value.status) == ("CAPABILITY_NOT_FOUND", 404)
    assert missing.value.field == "capability"
    with pytest.raises(RegistryError) as blank:
        asyncio.run(agent.request_access("test.asked", " "))
    assert (blank.value.code, blank.value.field) == ("INVALID_ACCESS_REQUEST", "reason")
