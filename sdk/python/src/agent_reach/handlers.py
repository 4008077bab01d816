"""Handlers: plain functions, sync or async, and the capability descriptors derived from them.

A handler takes the payload (one parameter, annotated with its type) and optionally
a :class:`~agent_reach.Ctx` (a parameter annotated ``Ctx``), in either order, and
returns its output (annotated too). An async generator (``-> AsyncIterator[Item]``)
is a streaming handler: each item it yields reaches a caller that asks for
``text/event-stream`` as one event (DESIGN §8, "Streaming"); a caller that does not
gets the items as a list, which is what its registered output schema describes. The
input and output JSON Schemas come from the annotations, so what is registered always
matches the code. Everything is checked
when the decorator runs: a handler that cannot work never gets to start.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from . import schema
from .ctx import Ctx
from .errors import HandlerDefinitionError


class _Validator(Protocol):
    def validate_python(self, value: Any, /) -> Any: ...


class _Serializer(Protocol):
    def to_json(self, value: Any, /) -> bytes: ...


@dataclass(frozen=True)
class Descriptor:
    """What an instance registers for one capability (``CapabilitySpec``)."""

    capability: str
    version: str
    description: str
    input_schema: dict[str, Any] | bool
    output_schema: dict[str, Any] | bool
    timeout_ms: int | None
    #: Its task deliveries may be paused for higher-priority work (DESIGN §9).
    preemptible: bool = False

    def to_wire(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": self.capability,
            "version": self.version,
            "input_schema": self.input_schema,
            "output_schema": self.output_schema,
        }
        if self.description:
            spec["description"] = self.description
        if self.timeout_ms is not None:
            spec["timeout_ms"] = self.timeout_ms
        if self.preemptible:
            spec["preemptible"] = True
        return spec


@dataclass(frozen=True)
class Handler:
    """A capability implementation: its descriptor, the function, and how to call it."""

    descriptor: Descriptor
    function: Callable[..., Any]
    is_async: bool
    #: Positions of (payload, ctx) in the call: ctx is None when the handler takes none.
    ctx_first: bool | None
    input_adapter: TypeAdapter[Any] = field(repr=False)
    #: For a streaming handler, the adapter of the list of its items (its registered output).
    output_adapter: TypeAdapter[Any] = field(repr=False)
    #: A streaming handler (an async generator): the adapter of one item.
    item_adapter: TypeAdapter[Any] | None = field(default=None, repr=False)
    # pydantic-core's validators and serializer, called directly on the delivery path
    # (TypeAdapter's own methods add a Python layer per call, which the bench shows).
    input_validator: _Validator = field(init=False, repr=False)
    output_validator: _Validator = field(init=False, repr=False)
    serializer: _Serializer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_validator", self.input_adapter.validator)
        object.__setattr__(self, "output_validator", self.output_adapter.validator)
        object.__setattr__(self, "serializer", self.output_adapter.serializer)

    @property
    def name(self) -> str:
        return getattr(self.function, "__qualname__", repr(self.function))


def build_handler(
    function: Callable[..., Any],
    *,
    capability: str,
    version: str,
    description: str | None,
    timeout_ms: int | None,
    input_schema: dict[str, Any] | bool | None,
    output_schema: dict[str, Any] | bool | None,
    preemptible: bool = False,
) -> Handler:
    """Inspects ``function`` and builds its handler; every problem raises
    :class:`~agent_reach.errors.HandlerDefinitionError` naming the function."""
    name = getattr(function, "__qualname__", repr(function))

    def fail(problem: str) -> HandlerDefinitionError:
        return HandlerDefinitionError(name, capability, problem)

    if not callable(function):
        raise fail("a handler must be a function")
    if (problem := schema.check_capability_name(capability)) is not None:
        raise fail(problem)
    if (problem := schema.check_version(version)) is not None:
        raise fail(problem)
    if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0):
        raise fail(f"timeout_ms must be a positive number of milliseconds, not {timeout_ms!r}")
    if inspect.isgeneratorfunction(function):
        raise fail("a handler returns its output; to stream items, make it an async generator (`async def` + `yield`)")
    is_stream = inspect.isasyncgenfunction(function)
    try:
        hints = typing.get_type_hints(function)
    except Exception as error:  # a NameError or TypeError from a forward reference
        raise fail(
            f"its type annotations cannot be resolved: {error} (annotations are looked up in the "
            "function's module: define or import the types there, not inside a function)"
        ) from error
    parameters = list(inspect.signature(function).parameters.values())

    ctx_position: int | None = None
    payload_parameter: inspect.Parameter | None = None
    for position, parameter in enumerate(parameters):
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise fail(f"`{parameter.name}`: *args and **kwargs are not supported; take (payload[, ctx])")
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            raise fail(f"`{parameter.name}` is keyword-only; take (payload[, ctx]) as positional parameters")
        annotation = hints.get(parameter.name)
        if annotation is Ctx:
            if ctx_position is not None:
                raise fail("it takes two Ctx parameters; take one")
            ctx_position = position
        elif payload_parameter is None:
            payload_parameter = parameter
        else:
            raise fail(
                f"it takes more than one payload parameter (`{payload_parameter.name}`, `{parameter.name}`); "
                "take one payload (a pydantic model for several fields) and optionally `ctx: Ctx`"
            )
    if payload_parameter is None:
        raise fail("it takes no payload parameter; declare one, e.g. `def handle(payload: MyInput, ctx: Ctx)`")
    input_type = hints.get(payload_parameter.name, inspect.Parameter.empty)
    if input_type is inspect.Parameter.empty:
        raise fail(
            f"parameter `{payload_parameter.name}` has no type annotation; annotate it with a pydantic model "
            "or a type (`dict[str, Any]` accepts any object), so the input schema can be derived"
        )
    if "return" not in hints:
        raise fail(
            "it has no return annotation; annotate the output type (`-> dict[str, Any]` for any object), "
            "so the output schema can be derived"
        )
    output_type = hints["return"]
    item_type: Any = None
    if is_stream:
        if typing.get_origin(output_type) not in (
            collections.abc.AsyncIterator,
            collections.abc.AsyncGenerator,
            collections.abc.AsyncIterable,
        ) or not typing.get_args(output_type):
            raise fail("annotate a streaming handler's return as `AsyncIterator[Item]` (the type of what it yields)")
        item_type = typing.get_args(output_type)[0]
        output_type = list[item_type]
    is_async = inspect.iscoroutinefunction(function)
    if is_async and typing.get_origin(output_type) in (typing.Awaitable, typing.Coroutine):
        raise fail("annotate an async handler's return as its output type, not as an awaitable")

    try:
        input_adapter = schema.adapter_for(input_type, "input")
        output_adapter = schema.adapter_for(output_type, "output")
        item_adapter = schema.adapter_for(item_type, "output") if is_stream else None
        derived_input = schema.schema_of(input_adapter, input_type, "input", "validation")
        derived_output = schema.schema_of(output_adapter, output_type, "output", "serialization")
        registered_input = input_schema if input_schema is not None else derived_input
        registered_output = output_schema if output_schema is not None else derived_output
        schema.check_schema(registered_input, "input")
        schema.check_schema(registered_output, "output")
    except schema.SchemaProblem as problem:
        raise fail(str(problem)) from problem

    doc = inspect.getdoc(function) or ""
    descriptor = Descriptor(
        capability=capability,
        version=version,
        description=description if description is not None else (doc.splitlines()[0] if doc else ""),
        input_schema=registered_input,
        output_schema=registered_output,
        timeout_ms=timeout_ms,
        preemptible=preemptible,
    )
    return Handler(
        descriptor=descriptor,
        function=function,
        is_async=is_async,
        ctx_first=None if ctx_position is None else ctx_position < parameters.index(payload_parameter),
        input_adapter=input_adapter,
        output_adapter=output_adapter,
        item_adapter=item_adapter,
    )


def validation_details(error: ValidationError) -> list[dict[str, str]]:
    """Each problem with the JSON pointer of the value at fault, as the router's SCHEMA_MISMATCH does."""
    out = []
    for problem in error.errors(include_url=False):
        pointer = "".join(f"/{str(part).replace('~', '~0').replace('/', '~1')}" for part in problem["loc"])
        out.append({"pointer": pointer, "message": problem["msg"]})
    return out
