"""Session context against the real context service and Redis: read, versioned and
conditional patches, deletes and close, from a handler (async and sync) and a client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agent_reach import Agent, Client, ContextNotFound, Ctx, VersionConflict

from .conftest import make_agent
from .support.stack import Stack


def test_context_round_trip_from_handlers(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)

    @agent.handler("test.ctx.async")
    async def remember(payload: dict[str, str], ctx: Ctx) -> dict[str, Any]:
        seen = await ctx.context.get()
        version = await ctx.context.patch(set={"intent": payload["intent"]}, if_version=seen.version)
        try:
            await ctx.context.patch(set={"intent": "stale"}, if_version=seen.version)
            conflict = None
        except VersionConflict as error:
            conflict = error.current_version
        after = await ctx.context.get(["intent", "user_id"])
        return {"before": seen.version, "after": version, "conflict_at": conflict, "fields": after.fields}

    @agent.handler("test.ctx.sync")
    def forget(payload: dict[str, str], ctx: Ctx) -> dict[str, Any]:
        version = ctx.context.patch_sync(delete=["intent"])
        fields = ctx.context.get_sync().fields
        ctx.context.close_sync()
        return {"version": version, "fields": fields}

    start_agent(agent)
    with Client(router=stack.router.url, context=stack.context.url, token=stack.token("tester")) as client:
        created = client.create_context({"user_id": "ada"}, tier="one_shot")
        assert created.version == 1
        result = client.invoke("test.ctx.async", {"intent": "ask_ship_today"}, context_id=created.context_id)
        assert result.output == {
            "before": 1,
            "after": 2,
            "conflict_at": 2,
            "fields": {"intent": "ask_ship_today", "user_id": "ada"},
        }
        assert client.get_context(created.context_id).version == 2
        # A stale conditional patch from the client side too.
        with pytest.raises(VersionConflict) as conflict:
            client.patch_context(created.context_id, set={"intent": "x"}, if_version=1)
        assert conflict.value.current_version == 2
        assert conflict.value.status == 409

        result = client.invoke("test.ctx.sync", {}, context_id=created.context_id)
        assert result.output == {"version": 3, "fields": {"user_id": "ada"}}
        with pytest.raises(ContextNotFound):
            client.get_context(created.context_id)


def test_a_request_without_context_id_gets_a_clear_error(
    stack: Stack, start_agent: Callable[..., Agent], invoke: Callable[..., httpx.Response]
) -> None:
    agent = make_agent(stack)

    @agent.handler("test.ctx.none")
    async def needs_context(payload: dict[str, str], ctx: Ctx) -> dict[str, str]:
        await ctx.context.get()
        return {}

    start_agent(agent)
    error = invoke("test.ctx.none", {}).json()["error"]
    assert error["details"]["agent_code"] == "NO_CONTEXT"
