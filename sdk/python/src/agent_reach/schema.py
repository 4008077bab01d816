"""JSON Schemas (draft 2020-12) from type hints, and the checks the registry applies.

Schemas come from pydantic's ``TypeAdapter``, so a pydantic model, a dataclass, a
``TypedDict`` or a plain type (``str``, ``list[int]``, ``dict[str, Any]``) all work.
They are checked here against the 2020-12 meta-schema, the same check the registry
makes, so a bad schema fails when the handler is declared, not at registration.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import jsonschema.exceptions
from pydantic import PydanticSchemaGenerationError, TypeAdapter
from pydantic.errors import PydanticInvalidForJsonSchema, PydanticUserError

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

# DESIGN §2: lowercase dotted names, e.g. `order.query`.
CAPABILITY_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
# Semantic Versioning 2.0.0, as the registry's `semver` crate parses it.
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class SchemaProblem(Exception):
    """Why a type or a schema cannot be used; the handler decorator adds which handler."""


def adapter_for(annotation: Any, what: str) -> TypeAdapter[Any]:
    """A validating adapter for ``annotation``; ``what`` names it in the error."""
    try:
        return TypeAdapter(annotation)
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError) as error:
        raise SchemaProblem(f"the {what} type {annotation!r} cannot be validated: {_first_line(error)}") from error


def schema_of(adapter: TypeAdapter[Any], annotation: Any, what: str, mode: str) -> dict[str, Any]:
    """The JSON Schema of ``adapter``'s type; ``mode`` is ``validation`` (input) or ``serialization`` (output)."""
    try:
        schema = adapter.json_schema(mode="validation" if mode == "validation" else "serialization")
    except (PydanticInvalidForJsonSchema, PydanticUserError, TypeError) as error:
        raise SchemaProblem(f"the {what} type {annotation!r} has no JSON Schema: {_first_line(error)}") from error
    return {"$schema": DRAFT_2020_12, **schema}


def check_schema(schema: Any, what: str) -> None:
    """Raises :class:`SchemaProblem` unless ``schema`` is a valid draft 2020-12 schema."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaProblem(f"the {what} schema must be a JSON object or a boolean, not {type(schema).__name__}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as error:
        path = "/".join(str(part) for part in error.absolute_path)
        at = f" at `/{path}`" if path else ""
        raise SchemaProblem(f"the {what} schema is not valid JSON Schema 2020-12{at}: {error.message}") from error


def check_capability_name(name: str) -> str | None:
    """A problem with ``name``, or None."""
    if not CAPABILITY_NAME.match(name):
        return "capability names are lowercase dotted words like `order.query` ([a-z][a-z0-9_]* parts)"
    return None


def check_version(version: str) -> str | None:
    """A problem with ``version``, or None."""
    if not SEMVER.match(version):
        return f"version `{version}` is not a semantic version like `1.2.0`"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
