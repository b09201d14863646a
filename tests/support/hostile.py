"""Hypothesis strategies for hostile create bodies: every field a Response (or a Chat
completion) echoes or parses as a shape — reasoning, text.format, tools, tool_choice,
JSON Schemas, response_format — as a plausible value, a near miss, or junk of any type.

Used by the unit fuzz (in-process app, fake engine) and the integration fuzz (a real
server over HTTP and WebSocket); both check the same outcome with `check_outcome`."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import strategies as st

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=12),
)
JUNK: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def maybe(*values: Any) -> st.SearchStrategy[Any]:
    """One of `values` (twice as likely), or junk."""
    chosen = st.sampled_from(values)
    return st.one_of(chosen, chosen, JUNK)


_SCHEMA_KEYS = ("type", "properties", "items", "required", "enum", "anyOf", "$defs", "$ref")
SCHEMA: st.SearchStrategy[Any] = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "type": maybe("object", "string", "integer", "number", "array", "boolean", "null"),
            "required": maybe(["a"], [], "a"),
            "enum": maybe(["x", "y"], [], "x"),
            "pattern": maybe("^[a-z]+$", "(", "\\p{L}"),
            "minimum": maybe(0, 1.5, "0"),
            "additionalProperties": maybe(False, True, {}),
            "$ref": maybe("#/$defs/a", "#/nowhere", 3),
        },
    ),
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object")},
            optional={
                "properties": st.one_of(st.dictionaries(st.sampled_from("abc"), inner), JUNK),
                "required": maybe(["a"], ["zz"]),
                "$defs": st.one_of(st.dictionaries(st.just("a"), inner, max_size=1), JUNK),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={"items": st.one_of(inner, JUNK), "prefixItems": st.lists(inner, max_size=2)},
        ),
        st.fixed_dictionaries({"anyOf": st.one_of(st.lists(inner, max_size=2), JUNK)}),
        st.dictionaries(st.sampled_from(_SCHEMA_KEYS), JUNK, max_size=2),
    ),
    max_leaves=5,
)

NAME = maybe("f", "g", "lookup", "bad name!", "", "x" * 70)


def function_fields() -> dict[str, st.SearchStrategy[Any]]:
    return {
        "description": maybe("Look it up.", None),
        "parameters": st.one_of(SCHEMA, JUNK),
        "strict": maybe(True, False, None),
    }


RESPONSES_TOOL: st.SearchStrategy[Any] = st.one_of(
    st.fixed_dictionaries({"type": maybe("function"), "name": NAME}, optional=function_fields()),
    st.fixed_dictionaries(
        {"type": st.just("custom"), "name": NAME},
        optional={
            "description": maybe("Raw text."),
            "format": maybe(
                {"type": "text"},
                {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
                {"type": "grammar", "syntax": "lark", "definition": "start: /x/"},
                {"type": "grammar", "syntax": {}, "definition": []},
            ),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("namespace"), "name": NAME},
        optional={
            "description": maybe("CRM tools.", None),
            "tools": st.one_of(
                st.lists(
                    st.fixed_dictionaries(
                        {"type": maybe("function", "custom"), "name": NAME},
                        optional=function_fields(),
                    ),
                    max_size=2,
                ),
                JUNK,
            ),
        },
    ),
    st.fixed_dictionaries(
        {"type": maybe("web_search", "file_search", "local_shell", "shell", "apply_patch", "mcp")}
    ),
    st.dictionaries(st.sampled_from(("type", "name", "tools")), JUNK, max_size=3),
)

RESPONSES_TOOL_CHOICE: st.SearchStrategy[Any] = st.one_of(
    maybe("auto", "none", "required", "any"),
    st.fixed_dictionaries(
        {"type": maybe("function", "custom", "local_shell", "web_search_preview", "mcp")},
        optional={"name": NAME, "namespace": maybe("crm")},
    ),
    st.fixed_dictionaries(
        {"type": st.just("allowed_tools")},
        optional={
            "mode": maybe("auto", "required"),
            "tools": st.one_of(
                st.lists(st.fixed_dictionaries({"type": maybe("function"), "name": NAME})),
                JUNK,
            ),
        },
    ),
)

TEXT_FORMAT: st.SearchStrategy[Any] = st.one_of(
    st.fixed_dictionaries({"type": maybe("text", "json_object")}),
    st.fixed_dictionaries(
        {"type": st.just("json_schema")},
        optional={
            "name": NAME,
            "schema": st.one_of(SCHEMA, JUNK),
            "strict": maybe(True, False),
            "description": maybe("An answer."),
        },
    ),
    JUNK,
)

RESPONSES_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "reasoning": st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "effort": maybe("none", "low", "medium", "high", "xhigh", "extreme"),
                "summary": maybe("auto", "concise", "detailed", "verbose"),
                "generate_summary": maybe("auto", "x"),
                "context": maybe("auto", "all_turns", "x"),
                "mode": maybe("standard", "x"),
            },
        ),
        JUNK,
    ),
    "text": st.one_of(
        st.fixed_dictionaries(
            {}, optional={"format": TEXT_FORMAT, "verbosity": maybe("low", "high", "loud")}
        ),
        JUNK,
    ),
    "tools": st.one_of(st.lists(RESPONSES_TOOL, max_size=3), JUNK),
    "tool_choice": st.one_of(RESPONSES_TOOL_CHOICE, JUNK),
    "instructions": maybe("Be brief."),
    "max_output_tokens": maybe(4, 16, 0, -1),
    "max_tool_calls": maybe(1, 2, 0),
    "top_logprobs": maybe(0, 2, 21),
    "truncation": maybe("auto", "disabled", "middle"),
    "parallel_tool_calls": maybe(True, False),
    "store": maybe(True, False),
    "background": maybe(False, True),
    "prompt_cache_key": maybe("k"),
    "prompt_cache_retention": maybe("in_memory", "24h", "forever"),
    "safety_identifier": maybe("user-1"),
    "user": maybe("u"),
    "metadata": maybe({"a": "b"}, {"a": 1}),
    "service_tier": maybe("auto", "default", "flex", "turbo"),
    "include": maybe(["message.output_text.logprobs"], ["reasoning.encrypted_content"], ["x"]),
    "temperature": maybe(0, 0.7, 2, 3),
    "top_p": maybe(0.9, 1, 2),
}

CHAT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "reasoning_effort": maybe("low", "high", "none", "extreme"),
    "response_format": st.one_of(
        st.fixed_dictionaries({"type": maybe("text", "json_object")}),
        st.fixed_dictionaries(
            {"type": st.just("json_schema")},
            optional={
                "json_schema": st.one_of(
                    st.fixed_dictionaries(
                        {"name": NAME}, optional={"schema": st.one_of(SCHEMA, JUNK)}
                    ),
                    JUNK,
                )
            },
        ),
        JUNK,
    ),
    "tools": st.one_of(
        st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "type": maybe("function"),
                        "function": st.one_of(
                            st.fixed_dictionaries({"name": NAME}, optional=function_fields()),
                            JUNK,
                        ),
                    }
                ),
                JUNK,
            ),
            max_size=2,
        ),
        JUNK,
    ),
    "tool_choice": st.one_of(
        maybe("auto", "none", "required"),
        st.fixed_dictionaries(
            {"type": maybe("function", "allowed_tools")},
            optional={
                "function": st.one_of(st.fixed_dictionaries({"name": NAME}), JUNK),
                "allowed_tools": JUNK,
            },
        ),
    ),
    "service_tier": maybe("auto", "default", "turbo"),
    "metadata": maybe({"a": "b"}, {"a": 1}),
    "max_tokens": maybe(4, 0),
    "logprobs": maybe(True, False),
    "top_logprobs": maybe(0, 2, 30),
    "stop": maybe(["x"], "x", [1]),
    "n": maybe(1, 2),
    "user": maybe("u"),
    "parallel_tool_calls": maybe(True, False),
}


def bodies(
    fields: dict[str, st.SearchStrategy[Any]], base: dict[str, Any], field: str
) -> st.SearchStrategy[dict[str, Any]]:
    """`base` with `field`, and perhaps one other of `fields`, each drawn from its
    strategy: few enough that a body often gets past the other checks to the one fuzzed."""
    other = st.sampled_from(sorted(set(fields) - {field}))
    extra = st.one_of(st.just({}), other.flatmap(lambda k: fields[k].map(lambda v: {k: v})))
    return st.tuples(fields[field], extra).map(lambda fe: {**base, **fe[1], field: fe[0]})


def sse_lines(text: str) -> list[str]:
    """An SSE body's lines, split where the SSE format ends lines (CR, LF, CRLF) only: JSON
    text may hold other line breaks of Unicode's (U+0085, U+2028) unescaped."""
    return re.split(r"\r\n|\r|\n", text)


def sse_data(text: str) -> list[Any]:
    """The JSON (or `[DONE]`) of each `data:` line of an SSE body."""
    out: list[Any] = []
    for line in sse_lines(text):
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def check_stream_end(status: int, text: str, *, chat: bool) -> None:
    """A 200 stream ends with a terminal event (Responses) or `[DONE]` (Chat)."""
    if status != 200:
        return
    frames = sse_data(text)
    assert frames, "a 200 stream with no event"
    if chat:
        assert frames[-1] == "[DONE]", frames[-3:]
    else:
        assert frames[-1]["type"] in TERMINAL, frames[-1]
