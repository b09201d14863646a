"""Structured output: the JSON Schema an answer must follow, from either API's format field.

Responses sends `text.format` (`{"type":"json_schema", name, schema, strict}` or
`{"type":"json_object"}`); Chat Completions sends `response_format` with the schema nested
under `json_schema`. Both become one schema (`json_object`: any JSON object) that `plan.py`
makes the answer's constraint; `check` (the engine's schema check) refuses what the engine
cannot enforce.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from respd.engines.constraints import ANY_OBJECT, SchemaRejected
from respd.protocol.errors import InvalidRequest, MissingParameter
from respd.protocol.responses import TextFormat
from respd.protocol.schema import check_schema_document
from respd.service.tools.definitions import NAME_RE

SchemaCheck = Callable[[dict[str, Any]], None]


def _schema(
    kind: str, name: Any, schema: Any, param: str, check: SchemaCheck
) -> dict[str, Any] | None:
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        raise InvalidRequest(
            f"Invalid value for '{param}.type': {kind!r}. Expected 'text', 'json_schema' or "
            "'json_object'.",
            param=f"{param}.type",
            code="invalid_value",
        )
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest(
            f"Invalid '{param}.name': expected 1-64 characters of a-z, A-Z, 0-9, '_' or '-'.",
            param=f"{param}.name",
            code="invalid_value",
        )
    if not isinstance(schema, dict):
        raise MissingParameter(f"{param}.schema")
    check_schema_document(schema, f"{param}.schema")
    try:
        check(schema)
    except SchemaRejected as exc:
        raise InvalidRequest(
            f"Invalid schema in '{param}': {exc}.", param=param, code="invalid_value"
        ) from exc
    return schema


def responses_answer_schema(fmt: TextFormat | None, check: SchemaCheck) -> dict[str, Any] | None:
    if fmt is None:
        return None
    return _schema(fmt.type, fmt.name, fmt.schema_, "text.format", check)


def chat_answer_schema(
    response_format: dict[str, Any] | None, check: SchemaCheck
) -> dict[str, Any] | None:
    if not response_format:
        return None
    kind = response_format.get("type", "text")
    spec = response_format.get("json_schema")
    spec = spec if isinstance(spec, dict) else {}
    if kind == "json_schema" and not response_format.get("json_schema"):
        raise MissingParameter("response_format.json_schema")
    return _schema(
        str(kind),
        spec.get("name"),
        spec.get("schema"),
        "response_format.json_schema" if kind == "json_schema" else "response_format",
        check,
    )
