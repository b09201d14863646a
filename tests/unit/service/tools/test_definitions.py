"""A function tool's `parameters` must be an object schema (or absent: no arguments) in
both APIs; anything else is a 400 naming the tool's parameters."""

from __future__ import annotations

from typing import Any

import pytest

from respd.engines.constraints import check_schema
from respd.protocol.errors import InvalidRequest
from respd.service.tools.definitions import chat_tools, responses_tools

NOT_OBJECT_SCHEMAS: list[Any] = [
    {"type": "array"},
    {"type": "array", "items": {"type": "string"}},
    {"type": "string"},
    {"type": ["object", "null"]},
    [],
    "object",
    7,
]
OBJECT_SCHEMAS: list[Any] = [
    None,
    {"type": "object"},
    {"type": "object", "properties": {}},
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
]


def _check(schema: dict[str, Any]) -> None:
    check_schema(schema)


@pytest.mark.parametrize("parameters", NOT_OBJECT_SCHEMAS)
def test_non_object_parameters_are_400_in_responses(parameters: Any) -> None:
    ok = {"type": "function", "name": "ok"}
    bad = {"type": "function", "name": "f", "parameters": parameters}
    with pytest.raises(InvalidRequest) as info:
        responses_tools([ok, bad], _check)
    assert info.value.param == "tools[1].parameters"
    assert info.value.status_code == 400
    assert "'object'" in info.value.message


@pytest.mark.parametrize("parameters", NOT_OBJECT_SCHEMAS)
def test_non_object_parameters_are_400_in_chat(parameters: Any) -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(InvalidRequest) as info:
        chat_tools([bad], _check)
    assert info.value.param == "tools[0].function.parameters"
    assert info.value.status_code == 400


@pytest.mark.parametrize("parameters", OBJECT_SCHEMAS)
def test_object_or_absent_parameters_are_accepted(parameters: Any) -> None:
    fields: dict[str, Any] = {"name": "f"}
    if parameters is not None:
        fields["parameters"] = parameters
    (tool,) = responses_tools([{"type": "function", **fields}], _check).tools
    assert tool.parameters == parameters
    (tool,) = chat_tools([{"type": "function", "function": fields}], _check)
    assert tool.parameters == parameters
