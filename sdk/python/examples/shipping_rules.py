"""`shipping.rules` of the worked example ("Can my order ship today?"), served from Python.

It takes the place of the Rust `shipping_rules` agent: the Rust `order_query` calls it
through the router, it calls the Rust `reply.write` back, and returns the chain of hops
in the shape the Rust agents use (examples/src/lib.rs), so the demo's caller cannot tell
the difference. Run it against running services:

    AGENT_REACH_REGISTRY=http://127.0.0.1:7400 AGENT_REACH_ROUTER=http://127.0.0.1:7500 \\
    AGENT_REACH_TOKEN="$(agent-reach token issue --name shipping_rules --secret-file hs256.secret)" \\
        python sdk/python/examples/shipping_rules.py --agent-id shipping_rules-py
"""

from __future__ import annotations

import argparse
import logging

from pydantic import BaseModel

from agent_reach import Agent, Ctx

#: Orders placed before this hour ship the same day.
CUTOFF_HOUR = 15


class OrderStatus(BaseModel):
    order_id: str
    status: str
    warehouse: str
    #: Hour of day (0-23) the order was placed.
    placed_at_hour: int


class ShippingQuestion(BaseModel):
    order: OrderStatus


class ReplyRequest(BaseModel):
    ships_today: bool
    reason: str


class Reply(BaseModel):
    reply: str
    trace_id: str


class Hop(BaseModel):
    """One call in the chain, as its caller saw it."""

    capability: str
    agent_id: str
    attempts: int
    duration_ms: int
    #: The trace id the called agent saw (one trace across the chain).
    trace_id: str


class Chain(BaseModel):
    reply: str
    ships_today: bool
    trace: list[Hop]
    #: The trace id this agent saw.
    trace_id: str


def decide(order: OrderStatus) -> tuple[bool, str]:
    if order.status != "paid":
        return False, f"it is not paid yet ({order.status})"
    if order.placed_at_hour >= CUTOFF_HOUR:
        return False, f"it was placed after the {CUTOFF_HOUR}:00 cutoff; it ships tomorrow"
    return True, f"it is paid and leaves warehouse {order.warehouse} before the cutoff"


def build(agent_id: str | None = None, listen: str = "127.0.0.1:0", endpoint: str | None = None) -> Agent:
    """The agent; links (registry, router, token) come from the AGENT_REACH_* variables."""
    agent = Agent("shipping_rules", agent_id=agent_id, listen=listen, endpoint=endpoint)

    @agent.handler("shipping.rules", version="1.0.0", description="Same-day shipping rules (Python)")
    async def shipping_rules(question: ShippingQuestion, ctx: Ctx) -> Chain:
        ships_today, reason = decide(question.order)
        answer = await ctx.call_envelope("reply.write", ReplyRequest(ships_today=ships_today, reason=reason))
        reply = Reply.model_validate(answer.output)
        hop = Hop(
            capability="reply.write",
            agent_id=answer.agent_id,
            attempts=answer.attempts,
            duration_ms=answer.duration_ms,
            trace_id=reply.trace_id,
        )
        return Chain(reply=reply.reply, ships_today=ships_today, trace=[hop], trace_id=ctx.trace_id or "none")

    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-id", default=None, help="unique id of this instance (default: shipping_rules-xxxx)")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve on")
    parser.add_argument("--endpoint", default=None, help="externally reachable base URL (default: the bound address)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    build(args.agent_id, listen=args.listen, endpoint=args.endpoint).run()


if __name__ == "__main__":
    main()
