"""What a Response echoes is checked when the request is read: a value the Response could
not hold is a 400 naming it, streamed or not, before anything runs; what the Response's
types require but a client may leave out (a namespace's description) is completed.
Type confusion in tools, tool_choice and JSON Schemas is a 400 in both APIs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from respd.engines.fake import FakeEngine
from respd.protocol.echo import check_value, echo_tools
from respd.protocol.errors import InvalidRequest
from respd.protocol.schema import check_schema_document
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
BASE = {"model": FAKE_MODEL, "input": "hi"}
NS = {"type": "namespace", "name": "n"}
JSON_FORMAT = {"type": "json_schema", "name": "x"}
BAD_SCHEMAS = [{"type": "object", "properties": "abc"}, {"type": "array", "items": "abc"}]

# (extra body fields, the param the 400 names)
RESPONSES_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "verbose"}}, "reasoning.summary"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ({"tools": [{"type": {}}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": "abc"}]}, "tools[0].parameters"),
    ({"tools": [{**NS, "tools": [{"type": []}]}]}, "tools[0].tools[0].type"),
    ({"tool_choice": {"type": {}}}, "tool_choice.type"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "x", "tools": []}}, "tool_choice.mode"),
    ({"text": {"format": {"type": {}}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    *(
        ({"text": {"format": {**JSON_FORMAT, "schema": s}}}, "text.format.schema")
        for s in BAD_SCHEMAS
    ),
    *(
        ({"tools": [{"type": "function", "name": "f", "parameters": s}]}, "tools[0].parameters")
        for s in BAD_SCHEMAS
    ),
]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("extra", "param"), RESPONSES_REFUSED)
async def test_a_value_the_response_cannot_echo_is_a_400(
    http: httpx.AsyncClient, extra: dict[str, Any], param: str, stream: bool
) -> None:
    r = await http.post("/v1/responses", json={**BASE, **extra, "stream": stream})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    listed = await http.get("/v1/conversations/none/items")  # the app still answers
    assert listed.status_code < 500


@pytest.mark.parametrize(
    ("extra", "param"), [case for case in RESPONSES_REFUSED if "prompt_cache" not in case[1]]
)
async def test_input_tokens_refuses_the_same_values(  # of the fields a count takes
    http: httpx.AsyncClient, extra: dict[str, Any], param: str
) -> None:
    r = await http.post("/v1/responses/input_tokens", json={**BASE, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


CHAT_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"tool_choice": {"type": {}}}, "tool_choice.type"),
    *(
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}},
            "response_format.json_schema.schema",
        )
        for s in BAD_SCHEMAS
    ),
    *(
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": s}}]},
            "tools[0].function.parameters",
        )
        for s in BAD_SCHEMAS
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("extra", "param"), CHAT_REFUSED)
async def test_chat_refuses_type_confusion(
    http: httpx.AsyncClient, extra: dict[str, Any], param: str, stream: bool
) -> None:
    r = await http.post("/v1/chat/completions", json={**CHAT, **extra, "stream": stream})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


NAMESPACE = {
    "type": "namespace",
    "name": "crm",
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
}


@pytest.mark.parametrize("described", [True, False])
async def test_a_namespace_as_codex_sends_it_is_echoed(
    http: httpx.AsyncClient, engine: FakeEngine, described: bool
) -> None:
    engine.add("hello")
    tool = {**NAMESPACE, "description": "CRM tools"} if described else NAMESPACE
    r = await http.post("/v1/responses", json={**BASE, "tools": [tool]})
    assert r.status_code == 200, r.text
    response = strict_response(r.json())
    assert response.tools[0].type == "namespace"
    echoed = r.json()["tools"][0]
    assert echoed["description"] == ("CRM tools" if described else "")
    assert echoed["tools"][0]["name"] == "lookup"


def test_echo_tools_completes_only_what_the_types_require() -> None:
    tools = [{"type": "function", "name": "f"}, {"type": "function", "name": "g", "strict": False}]
    assert [t["strict"] for t in echo_tools(tools)] == [True, False]
    assert echo_tools([{"type": "web_search"}]) == [{"type": "web_search"}]


def test_check_value_names_the_path_inside_a_union_member() -> None:
    from openai.types.responses import Response

    tools = Response.model_fields["tools"].annotation
    with pytest.raises(InvalidRequest) as exc:
        check_value(tools, [{"type": "function", "name": "f", "strict": [1]}], "tools")
    assert exc.value.param == "tools[0].strict"
    with pytest.raises(InvalidRequest) as exc:
        check_value(tools, [{"type": "nope"}], "tools")
    assert exc.value.param == "tools[0].type" and "'nope'" in exc.value.message


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": [{"type": "string"}]},  # draft-07 tuple items
        {"type": "string", "pattern": "\\p{L}+"},  # ECMA 262, not Python, syntax
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}},
    ],
)
def test_valid_schema_documents_pass(schema: dict[str, Any]) -> None:
    check_schema_document(schema, "p")


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"properties": "abc"}, "properties"),
        ({"items": "abc"}, "items"),
        ({"required": "a"}, "required"),
        ({"properties": {"a": {"type": "wat"}}}, "properties.a.type"),
        ({"anyOf": [{"type": 1}]}, "anyOf[0].type"),
        ({"$schema": {}, "type": "object"}, "$schema"),
        ("abc", None),
    ],
)
def test_invalid_schema_documents_are_400s_saying_where(schema: Any, where: str | None) -> None:
    with pytest.raises(InvalidRequest) as exc:
        check_schema_document(schema, "text.format.schema")
    assert exc.value.param == "text.format.schema"
    if where is not None:
        assert f"at '{where}'" in exc.value.message
