"""Handlers from plain functions: schemas from type hints, and every definition error
failing when the decorator runs (at import), naming the handler."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from agent_reach import Agent, ConfigError, Ctx, HandlerDefinitionError


class Question(BaseModel):
    user_id: str
    text: str


class Answer(BaseModel):
    reply: str
    confidence: float = 1.0


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    width: int
    height: int


class Opaque:
    """A class pydantic cannot validate or describe."""


def agent() -> Agent:
    return Agent("py_agent")


def test_schemas_come_from_the_annotations_and_are_valid_2020_12() -> None:
    a = agent()

    @a.handler("test.models", version="2.0.0", timeout_ms=15000)
    async def models(payload: Question, ctx: Ctx) -> Answer:
        """Answer a question.

        Longer text is not part of the description."""
        return Answer(reply=payload.text)

    @a.handler("test.plain")
    def plain(ctx: Ctx, payload: list[int]) -> str:
        return str(sum(payload))

    @a.handler("test.typed_dict")
    def typed(payload: Point) -> Box:
        return Box(payload["x"], payload["y"])

    @a.handler("test.anything")
    def anything(payload: dict[str, Any]) -> None:
        return None

    descriptors = {handler.descriptor.capability: handler.descriptor for handler in a.handlers}
    models_descriptor = descriptors["test.models"]
    assert models_descriptor.version == "2.0.0"
    assert models_descriptor.timeout_ms == 15000
    assert models_descriptor.description == "Answer a question."
    assert models_descriptor.input_schema["required"] == ["user_id", "text"]  # type: ignore[index]
    assert models_descriptor.output_schema["properties"]["confidence"]["type"] == "number"  # type: ignore[index]
    assert descriptors["test.plain"].input_schema["items"] == {"type": "integer"}  # type: ignore[index]
    assert descriptors["test.typed_dict"].output_schema["required"] == ["width", "height"]  # type: ignore[index]
    assert descriptors["test.anything"].output_schema["type"] == "null"  # type: ignore[index]
    for descriptor in descriptors.values():
        jsonschema.Draft202012Validator.check_schema(descriptor.input_schema)
        jsonschema.Draft202012Validator.check_schema(descriptor.output_schema)
        wire = descriptor.to_wire()
        assert wire["name"] == descriptor.capability
    # The ctx parameter may come first or second.
    plain_handler = next(h for h in a.handlers if h.descriptor.capability == "test.plain")
    assert plain_handler.ctx_first is True
    assert not plain_handler.is_async


def test_explicit_schemas_replace_the_derived_ones() -> None:
    a = agent()
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 10}}, "required": ["q"]}

    @a.handler("test.explicit", input_schema=schema, output_schema=True)
    def explicit(payload: dict[str, Any]) -> dict[str, Any]:
        return payload

    assert a.handlers[0].descriptor.input_schema == schema
    assert a.handlers[0].descriptor.output_schema is True


def define(function: Any, capability: str = "test.thing", **options: Any) -> HandlerDefinitionError:
    with pytest.raises(HandlerDefinitionError) as failure:
        agent().handler(capability, **options)(function)
    message = str(failure.value)
    assert f"handler `{function.__qualname__}` for `{capability}`" in message, message
    return failure.value


def test_bad_signatures_fail_at_definition_naming_the_handler() -> None:
    def no_payload(ctx: Ctx) -> str:
        return ""

    def unannotated(payload) -> str:  # type: ignore[no-untyped-def]
        return ""

    def no_return(payload: str):  # type: ignore[no-untyped-def]
        return payload

    def two_payloads(a: str, b: str) -> str:
        return a + b

    def star_args(*payloads: str) -> str:
        return ""

    def keyword_only(*, payload: str) -> str:
        return payload

    def two_ctx(payload: str, a: Ctx, b: Ctx) -> str:
        return payload

    def generator(payload: str) -> Any:
        yield payload

    async def stream_unannotated(payload: str) -> str:  # type: ignore[misc]
        yield payload

    def opaque_input(payload: Opaque) -> str:
        return ""

    def unresolvable(payload: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    assert "no payload parameter" in str(define(no_payload))
    assert "has no type annotation" in str(define(unannotated))
    assert "no return annotation" in str(define(no_return))
    assert "more than one payload parameter" in str(define(two_payloads))
    assert "*args and **kwargs" in str(define(star_args))
    assert "keyword-only" in str(define(keyword_only))
    assert "two Ctx parameters" in str(define(two_ctx))
    assert "make it an async generator" in str(define(generator))
    assert "AsyncIterator[Item]" in str(define(stream_unannotated))
    assert "cannot be validated" in str(define(opaque_input))
    assert "cannot be resolved" in str(define(unresolvable))


def test_bad_names_versions_timeouts_and_schemas_fail_at_definition() -> None:
    def handler(payload: str) -> str:
        return payload

    assert "lowercase dotted" in str(define(handler, capability="Order.Query"))
    assert "lowercase dotted" in str(define(handler, capability="cap:text_summarize"))
    assert "not a semantic version" in str(define(handler, version="2.0"))
    assert "timeout_ms must be a positive" in str(define(handler, timeout_ms=0))
    problem = str(define(handler, input_schema={"type": "strnig"}))
    assert "input schema is not valid JSON Schema 2020-12" in problem
    assert "at `/type`" in problem
    assert "output schema must be a JSON object or a boolean" in str(define(handler, output_schema=[1]))


def test_duplicate_capability_versions_are_refused() -> None:
    a = agent()

    @a.handler("test.dup", version="1.0.0")
    def first(payload: str) -> str:
        return payload

    @a.handler("test.dup", version="1.1.0")  # another version is fine
    def second(payload: str) -> str:
        return payload

    with pytest.raises(HandlerDefinitionError, match=r"already handles `test\.dup` 1\.0\.0"):

        @a.handler("test.dup", version="1.0.0")
        def third(payload: str) -> str:
            return payload


def test_configuration_problems_are_reported_all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENT_REACH_REGISTRY", "AGENT_REACH_TOKEN", "AGENT_REACH_ROUTER"):
        monkeypatch.delenv(name, raising=False)
    a = Agent("py_agent", weight=0, max_concurrency=0, endpoint="ftp://x")
    with pytest.raises(ConfigError) as failure:
        a.start(handle_signals=False)
    problems = failure.value.problems
    assert any("no handler" in problem for problem in problems)
    assert any("no registry URL" in problem for problem in problems)
    assert any("no token" in problem for problem in problems)
    assert any("weight must be 1..=1000" in problem for problem in problems)
    assert any("max_concurrency" in problem for problem in problems)
    assert any("endpoint must be an http" in problem for problem in problems)
    assert any("needs its keys" in problem for problem in problems)
