"""Output constraints as engine-neutral values, and the schema checks every engine shares.

The service says *what* the output must be — calls to some functions with schema-valid
arguments, or an answer that validates against a JSON Schema, or either — and each engine
enforces it its own way (llama.cpp: a GBNF grammar for its sampler; a remote server:
`tool_choice` and `response_format`).

| request                                   | `Constraint`                      |
|-------------------------------------------|-----------------------------------|
| tool_choice required / named / allowed    | `calls`, no `answer` (forced)     |
| json_schema / json_object answer          | `answer`                          |
| both an answer schema and tools (auto)    | `calls` and `answer` (either one) |
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from respd.engines.messages import ToolDefinition

MAX_SCHEMA_CHARS = 32_768
MAX_SCHEMA_DEPTH = 10  # levels of properties / items
MAX_SCHEMA_NESTING = 64  # sub-schemas inside sub-schemas, of any kind
# Schema keys that hold sub-schemas, by how they nest.
SCHEMA_MAPS = ("properties", "$defs", "definitions")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_SINGLES = ("items", "additionalProperties")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class SchemaRejected(ValueError):
    """The schema cannot be enforced; the message says why and where."""


class ConstraintError(ValueError):
    """A constraint cannot be enforced by this engine; `target` says which part (`calls`:
    a tool's parameters, `answer`: the answer format)."""

    def __init__(self, message: str, target: str) -> None:
        super().__init__(message)
        self.target = target


@dataclass(frozen=True)
class CallsConstraint:
    """Output that is one or more calls to `tools` (at most `max_calls`; None: any)."""

    tools: tuple[ToolDefinition, ...]
    max_calls: int | None = None


@dataclass(frozen=True)
class Constraint:
    calls: CallsConstraint | None = None
    answer: dict[str, Any] | None = None  # the JSON Schema a text answer must follow

    @property
    def forced_calls(self) -> bool:
        """The output must be calls (no text answer is allowed)."""
        return self.calls is not None and self.answer is None


def walk_schema(
    schema: Any, path: str = "#", depth: int = 0, nesting: int = 0
) -> list[tuple[str, dict[str, Any]]]:
    """Every sub-schema object with its JSON-pointer-ish path, checking depth and shape."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        raise SchemaRejected(f"{path} must be a schema object")
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaRejected(f"{path} is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if nesting > MAX_SCHEMA_NESTING:
        raise SchemaRejected(f"{path} is nested deeper than {MAX_SCHEMA_NESTING} sub-schemas")
    found = [(path, schema)]
    for key in SCHEMA_MAPS:
        members = schema.get(key)
        if isinstance(members, dict):
            for name, sub in members.items():
                step = depth + (key == "properties")
                found += walk_schema(sub, f"{path}/{key}/{name}", step, nesting + 1)
    for key in SCHEMA_LISTS:
        members = schema.get(key)
        if isinstance(members, list):
            for i, sub in enumerate(members):
                step = depth + (key == "prefixItems")
                found += walk_schema(sub, f"{path}/{key}/{i}", step, nesting + 1)
    for key in SCHEMA_SINGLES:
        sub = schema.get(key)
        if isinstance(sub, dict):
            found += walk_schema(sub, f"{path}/{key}", depth + 1, nesting + 1)
        elif isinstance(sub, list):
            for i, s in enumerate(sub):
                found += walk_schema(s, f"{path}/{key}/{i}", depth + 1, nesting + 1)
    return found


def check_schema(schema: Any) -> list[tuple[str, dict[str, Any]]]:
    """The checks every engine shares: a JSON object of bounded size and depth whose
    `$ref`s are local. Returns the walked sub-schemas for engine-specific checks."""
    if not isinstance(schema, dict):
        raise SchemaRejected("the schema must be a JSON object")
    try:
        text = json.dumps(schema)
    except (ValueError, RecursionError) as exc:
        raise SchemaRejected("the schema is not serialisable JSON") from exc
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaRejected(f"the schema is larger than {MAX_SCHEMA_CHARS} characters of JSON")
    nodes = walk_schema(schema)
    for path, node in nodes:
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
            raise SchemaRejected(
                f"only local '$ref's ('#/...') are supported, got {ref!r} at {path}"
            )
    return nodes
