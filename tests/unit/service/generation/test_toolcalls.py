"""Pure unit tests of the incremental tool-call parser, one family at a time.

Every case is fed whole and in tiny deltas (1, 2, 3 and 7 characters); the reading must not
depend on where the deltas fall, argument deltas must concatenate to the final arguments,
and with 1-character deltas the arguments must stream in many pieces, not one at the end.
"""

from __future__ import annotations

import json

import pytest

from respd.engines.families.tools import GENERIC, HERMES, LLAMA3, MISTRAL, ToolFormat
from respd.service.generation.toolcalls import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    ParseEvent,
    TextDelta,
    ToolCallParser,
)


def feed(fmt: ToolFormat, text: str, step: int, **kw: object) -> list[ParseEvent]:
    parser = ToolCallParser(fmt, **kw)  # type: ignore[arg-type]
    events: list[ParseEvent] = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    return events + parser.finish()


def merged(events: list[ParseEvent]) -> list[ParseEvent]:
    out: list[ParseEvent] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + e.text)
        elif isinstance(e, ArgumentsDelta) and isinstance(last, ArgumentsDelta):
            out[-1] = ArgumentsDelta(e.index, last.delta + e.delta)
        else:
            out.append(e)
    return out


def check(fmt: ToolFormat, text: str, **kw: object) -> list[ParseEvent]:
    whole = merged(feed(fmt, text, len(text) or 1, **kw))
    for step in (1, 2, 3, 7):
        events = feed(fmt, text, step, **kw)
        assert merged(events) == whole, f"step {step}"
        for e in events:  # message text is a verbatim run of the input, at its offset
            if isinstance(e, TextDelta):
                assert text[e.start : e.start + len(e.text)] == e.text, (step, e)
        for fin in (e for e in events if isinstance(e, CallFinished)):
            deltas = [
                e.delta for e in events if isinstance(e, ArgumentsDelta) and e.index == fin.index
            ]
            assert "".join(deltas) == fin.arguments
            if step == 1 and len(fin.arguments) > 8 and fin.complete:
                assert len(deltas) > 3, "arguments must stream while generated"
    return whole


def calls(events: list[ParseEvent]) -> list[tuple[str, object]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, CallFinished)]


def text(events: list[ParseEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.parametrize("fmt", [HERMES, GENERIC])
def test_hermes_text_then_two_calls(fmt: ToolFormat) -> None:
    out = check(
        fmt,
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n'
        "</tool_call>",
    )
    assert text(out) == "Let me look."
    assert calls(out) == [("get_weather", {"city": "Paris", "days": [1, 2]}), ("now", {})]
    assert isinstance(out[1], CallStarted) and out[1].name == "get_weather"


def test_hermes_braces_and_markers_inside_strings() -> None:
    out = check(
        HERMES,
        '<tool_call>{"name": "echo", "arguments": {"s": "a } \\" </tool_call> {"}}</tool_call>',
    )
    assert calls(out) == [("echo", {"s": 'a } " </tool_call> {'})]
    assert text(out) == ""


def test_hermes_undeclared_function_is_text() -> None:
    raw = 'ok <tool_call>{"name": "nope", "arguments": {}}</tool_call> bye'
    out = check(HERMES, raw, names={"f"})
    assert calls(out) == []
    assert text(out) == raw


def test_hermes_cut_off_call_is_incomplete() -> None:
    out = check(HERMES, '<tool_call>\n{"name": "f", "arguments": {"a": "xy', names={"f"})
    fin = [e for e in out if isinstance(e, CallFinished)]
    assert len(fin) == 1 and not fin[0].complete and fin[0].arguments == '{"a": "xy'


def test_max_calls_drops_the_rest() -> None:
    raw = "".join(
        f'<tool_call>{{"name": "f", "arguments": {{"i": {i}}}}}</tool_call>' for i in range(3)
    )
    out = check(HERMES, raw, max_calls=2)
    assert calls(out) == [("f", {"i": 0}), ("f", {"i": 1})]


def test_prose_without_calls_is_untouched() -> None:
    raw = "Plain answer with <b>tags</b>, [brackets] and {braces}.\n"
    for fmt in (HERMES, MISTRAL):
        assert text(check(fmt, raw)) == raw


def test_llama3_bare_json_and_python_tag() -> None:
    out = check(LLAMA3, '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}')
    assert calls(out) == [("f", {"x": 1}), ("g", {})]
    out = check(LLAMA3, '<|python_tag|>{"name": "f", "parameters": {"x": "}{"}}<|eom_id|>')
    assert calls(out) == [("f", {"x": "}{"})]
    assert text(out) == ""


def test_a_repeated_name_key_is_decided_by_the_first() -> None:
    # A call starts as soon as its first name is complete, so a later "name" key cannot
    # change the reading: read whole, the last name once made these text (or a call).
    offered = '{"name": "f", "name": "x", "parameters": {}}'
    assert calls(check(LLAMA3, offered, names={"f"})) == [("f", {})]
    unknown = '<tool_call>{"name": "x", "name": "f", "arguments": {}}</tool_call>'
    out = check(HERMES, unknown, names={"f"})
    assert calls(out) == [] and text(out) == unknown


def test_llama3_json_answer_is_not_a_call() -> None:
    raw = '{"answer": 42, "name": "Bob"}'
    out = check(LLAMA3, raw, names={"f"})
    assert calls(out) == [] and text(out) == raw


def test_mistral_list_and_string_arguments() -> None:
    out = check(
        MISTRAL,
        '[TOOL_CALLS] [{"name": "f", "arguments": {"a": [1, {"b": 2}]}}, '
        '{"arguments": "{\\"q\\": 2}", "name": "g"}]',
    )
    assert calls(out) == [("f", {"a": [1, {"b": 2}]}), ("g", {"q": 2})]
    assert text(out) == ""


def test_mistral_text_before_calls() -> None:
    out = check(MISTRAL, 'Sure.[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert text(out) == "Sure." and calls(out) == [("f", {})]
