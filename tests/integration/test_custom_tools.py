"""Custom (freeform) tools on the default model: a forced call's input is held to its
grammar — Codex's Lark grammar for apply_patch, and a regex — and comes back as a
`custom_tool_call`; namespaced functions come back with their namespace."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
import zstandard

from respd.service.tools.freeform import lark_to_regex
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID

PHONE = r"\d{3}-\d{4}"


def _patch_is_well_formed(text: str) -> bool:
    """The patch checked line by line, independently of the grammar's regex."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 3 or lines[0] != "*** Begin Patch" or lines[-1] != "*** End Patch":
        return False
    headers = ("*** Add File: ", "*** Delete File: ", "*** Update File: ")
    return lines[1].startswith(headers) and all(
        line.startswith(("+", "-", " ", "@@", "*** ")) for line in lines[1:-1]
    )


# A patch grammar in Lark with every part bounded, so that whatever the small model writes,
# the grammar closes the input within the budget (Codex's own grammar allows any number of
# lines: its translation is checked line for line in tests/unit/service/tools).
BOUNDED_PATCH = r"""
start: begin hunk end
begin: "*** Begin Patch" LF
hunk: "*** Add File: " FILENAME LF ("+" LINE LF)~1..3
end: "*** End Patch" LF?
FILENAME: /[a-z]{1,12}\.txt/
LINE: /[a-z ]{1,24}/
%import common.LF
"""


def test_a_forced_lark_tool_writes_input_in_its_grammar(client: openai.OpenAI) -> None:
    tool = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": BOUNDED_PATCH},
    }
    r = strict_response(
        client.responses.create(
            model=MODEL_ID,
            input="Create a file hello.txt that says hello.",
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "apply_patch"},
            parallel_tool_calls=False,
            max_output_tokens=200,
        ).model_dump(mode="json", exclude_unset=True, by_alias=True)
    )
    assert r.status == "completed", r.incomplete_details
    (call,) = r.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert re.fullmatch(lark_to_regex(BOUNDED_PATCH), call.input)
    assert _patch_is_well_formed(call.input), call.input


def test_a_forced_regex_tool_streams_input_that_matches(client: openai.OpenAI) -> None:
    tool = {
        "type": "custom",
        "name": "dial",
        "description": "Dial a phone number.",
        "format": {"type": "grammar", "syntax": "regex", "definition": PHONE},
    }
    events = list(
        client.responses.create(
            model=MODEL_ID,
            input="Call my office.",
            tools=[tool],  # type: ignore[list-item]
            tool_choice={"type": "custom", "name": "dial"},
            parallel_tool_calls=False,
            max_output_tokens=60,
            stream=True,
        )
    )
    wire = [e.model_dump(mode="json", exclude_unset=True) for e in events]
    for e in wire:
        strict_event(e)
    done = next(e for e in wire if e["type"] == "response.custom_tool_call_input.done")
    assert re.fullmatch(PHONE, done["input"])
    final = strict_response(wire[-1]["response"])
    (call,) = final.output
    assert call.type == "custom_tool_call" and call.input == done["input"]


def test_a_forced_namespace_function_names_its_namespace(client: openai.OpenAI) -> None:
    tools = [
        {
            "type": "namespace",
            "name": "weather",
            "description": "Weather tools.",
            "tools": [
                {
                    "type": "function",
                    "name": "forecast",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                }
            ],
        },
        {"type": "web_search"},
    ]
    r = client.responses.create(
        model=MODEL_ID,
        input="Weather in Paris?",
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "forecast", "namespace": "weather"},  # type: ignore[arg-type, typeddict-unknown-key]
        parallel_tool_calls=False,
        max_output_tokens=60,
    )
    (call,) = r.output
    assert call.type == "function_call"
    assert (call.name, call.namespace) == ("forecast", "weather")
    assert set(json.loads(call.arguments)) == {"city"}


def test_a_zstd_body_is_served_like_a_plain_one(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "input": "Say hi.", "max_output_tokens": 8}
    r = http.post(
        "/v1/responses",
        content=zstandard.ZstdCompressor().compress(json.dumps(body).encode()),
        headers={"content-type": "application/json", "content-encoding": "zstd"},
    )
    assert r.status_code == 200, r.text
    assert strict_response(r.json()).usage is not None


@pytest.mark.parametrize(
    ("fmt", "construct"),
    [
        ({"syntax": "lark", "definition": 'start: a\na: "(" a ")" | "x"'}, "recursive rule 'a'"),
        ({"syntax": "regex", "definition": r"(a)\1"}, "backreference"),
    ],
)
def test_grammars_it_cannot_hold_are_400s_naming_why(
    client: openai.OpenAI, fmt: dict[str, str], construct: str
) -> None:
    tool = {"type": "custom", "name": "t", "format": {"type": "grammar", **fmt}}
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model=MODEL_ID, input="x", tools=[tool])  # type: ignore[list-item]
    assert construct in exc.value.message


@pytest.mark.parametrize("kind", ["shell", "apply_patch"])
def test_a_forced_client_tool_call_comes_back_as_its_item(client: openai.OpenAI, kind: str) -> None:
    """OpenAI's client-run `shell` and `apply_patch` tools: forced, the model's call is
    held to the tool's arguments and comes back as a `shell_call` / `apply_patch_call`."""
    r = strict_response(
        client.responses.create(
            model=MODEL_ID,
            input="List the files here, then create notes.txt saying hi.",
            tools=[{"type": kind}],  # type: ignore[list-item]
            tool_choice={"type": kind},  # type: ignore[typeddict-item]
            max_output_tokens=120,
        ).model_dump(mode="json", exclude_unset=True, by_alias=True)
    )
    calls = [o for o in r.output if o.type == f"{kind}_call"]
    assert calls, r.output
    call = calls[0]
    if call.type == "shell_call":
        assert isinstance(call.action.commands, list)
    else:
        assert call.type == "apply_patch_call"
        assert call.operation.type in ("create_file", "update_file", "delete_file")
