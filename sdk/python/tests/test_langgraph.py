"""The LangChain/LangGraph adapter against the real stack: a LangGraph agent (a scripted
chat model from langchain-core's test models, a ToolNode) whose tools are two Agent-Reach
capabilities, run as an Agent-Reach capability by ``graph_handler``; the tool list is the
caller's under acl.yaml."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

from agent_reach import Agent, AsyncClient, Client, Ctx, RouterError
from agent_reach.integrations.langchain import capability_tools, capability_tools_sync, ctx_of, graph_handler

from .conftest import make_agent
from .support.stack import Stack


class Stock(BaseModel):
    sku: str


class Level(BaseModel):
    sku: str
    on_hand: int


class Question(BaseModel):
    question: str


class Reply(BaseModel):
    answer: str
    tool_results: list[str]
    session_id: str


class State(TypedDict):
    question: str
    messages: Annotated[list[AnyMessage], add_messages]
    answer: str
    tool_results: list[str]
    session_id: str


def inventory_agent(stack: Stack) -> Agent:
    agent = make_agent(stack, agent_id="py-lg-inventory")

    @agent.handler("test.lg.stock", description="How many of an item are in stock")
    async def stock(payload: Stock, ctx: Ctx) -> Level:
        return Level(sku=payload.sku, on_hand=7)

    @agent.handler("test.lg.price", description="The price of an item, in cents")
    async def price(sku: str, ctx: Ctx) -> int:
        return 1250 if sku == "A-1" else 0

    return agent


def scripted_model() -> GenericFakeChatModel:
    """The model's two turns: call both tools, then answer."""
    calls = [
        {"name": "test-lg-stock", "args": {"sku": "A-1"}, "id": "call-1"},
        {"name": "test-lg-price", "args": {"input": "A-1"}, "id": "call-2"},
    ]
    return GenericFakeChatModel(messages=iter([AIMessage(content="", tool_calls=calls), "A-1: 7 in stock, 12.50"]))


def test_a_langgraph_agent_calls_two_capabilities_as_tools(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    start_agent(inventory_agent(stack))

    async def listed() -> list[Any]:
        async with AsyncClient(router=stack.router.url, token=stack.token("py_agent")) as client:
            return await capability_tools(client, only=["test.lg.stock", "test.lg.price"])

    tools = asyncio.run(listed())
    assert sorted(tool.name for tool in tools) == ["test-lg-price", "test-lg-stock"]
    price = next(tool for tool in tools if tool.name == "test-lg-price")
    # A capability whose input is not an object takes it as `input`, as over MCP.
    assert list(price.args) == ["input"], price.args
    assert price.description == "The price of an item, in cents"

    model = scripted_model()
    seen: list[str] = []

    async def think(state: State, config: RunnableConfig) -> dict[str, Any]:
        ctx = ctx_of(config)
        assert ctx is not None, "the delivery's Ctx is in the run's config"
        seen.append(ctx.request_id)
        messages = state.get("messages") or [HumanMessage(state["question"])]
        return {"messages": [*messages[len(state.get("messages") or []) :], await model.ainvoke(messages)]}

    def finish(state: State, config: RunnableConfig) -> dict[str, Any]:
        ctx = ctx_of(config)
        results = [str(message.content) for message in state["messages"] if isinstance(message, ToolMessage)]
        return {
            "answer": str(state["messages"][-1].content),
            "tool_results": results,
            "session_id": ctx.session_id if ctx else "",
        }

    builder = StateGraph(State)
    builder.add_node("think", think)
    builder.add_node("tools", ToolNode(tools))
    builder.add_node("finish", finish)
    builder.add_edge(START, "think")
    builder.add_conditional_edges("think", tools_condition, {"tools": "tools", END: "finish"})
    builder.add_edge("tools", "think")
    builder.add_edge("finish", END)
    graph = builder.compile()

    assistant = make_agent(stack, agent_id="py-lg-assistant")
    assistant.handler("test.lg.assistant", description="Answers stock questions")(
        graph_handler(graph, input=Question, output=Reply)
    )
    start_agent(assistant)
    with Client(router=stack.router.url, token=stack.token("tester")) as caller:
        result = caller.invoke("test.lg.assistant", {"question": "Is A-1 in stock?"}, session_id="s-lg")
    reply = Reply.model_validate(result.output)
    assert reply.answer == "A-1: 7 in stock, 12.50"
    # Both capabilities ran, through the router, called by the graph's ToolNode.
    assert reply.tool_results == ['{"sku": "A-1", "on_hand": 7}', "1250"]
    # The tools called through the delivery's Ctx: the session travelled with them.
    assert reply.session_id == "s-lg"
    assert len(seen) == 2


def test_the_tools_are_the_callers_under_the_acl(stack: Stack, start_agent: Callable[..., Agent]) -> None:
    start_agent(inventory_agent(stack))
    with Client(router=stack.router.url, token=stack.token("tester")) as client:
        names = {tool.name for tool in capability_tools_sync(client)}
        assert {"test-lg-stock", "test-lg-price"} <= names
        stock = next(tool for tool in capability_tools_sync(client, only=["test.lg.stock"]))
        assert stock.invoke({"sku": "B-2"}) == {"sku": "B-2", "on_hand": 7}
        # A failed call is the tool's error, carrying the router's code, for the model to read.
        assert stock.invoke({"sku": 5}).startswith("SCHEMA_MISMATCH: ")
    # demo_user may call intent.parse only: the inventory is not among its tools.
    with Client(router=stack.router.url, token=stack.token("demo_user")) as client:
        assert not any(tool.name.startswith("test-lg-") for tool in capability_tools_sync(client))
        with pytest.raises(RouterError, match="not callable by this caller"):
            capability_tools_sync(client, only=["test.lg.stock"])
