"""Reasoning without a model: the incremental splitter, effort controls, reasoning input
items, and the reasoning item in the event machine (validated with the SDK's types)."""

from __future__ import annotations

import random

import pytest

from respd.engines.base import SamplingParams
from respd.engines.fake import FakeEngine
from respd.engines.families.reasoning import (
    COMMAND,
    HARMONY,
    MAGISTRAL,
    SEED,
    THINK,
    ReasoningStyle,
    detect_style,
    effort_variable,
    template_controls,
)
from respd.engines.families.tools import HERMES
from respd.engines.llamacpp.grammar import reasoning_first_grammar
from respd.protocol.errors import InvalidRequest
from respd.protocol.responses import CreateResponseRequest
from respd.service.generation.output import (
    CallFinished,
    CallStarted,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from respd.service.generation.thinking import (
    AnswerDelta,
    ReasoningReader,
    ReasoningSplitter,
    split_all,
)
from respd.service.generation.toolcalls import ToolCallParser
from respd.service.media.lowering import Lowering, require_effective_input
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import build_echo
from respd.service.responses.translate import input_to_messages
from tests.support.sdk_types import strict_event, strict_response


def _reader(style: ReasoningStyle, primed: bool, parser: ToolCallParser | None) -> ReasoningReader:
    return ReasoningReader(ReasoningSplitter(style, primed=primed), parser)


# (style, generated text, primed, expected thinking, expected answer)
CASES = [
    (
        THINK,
        "<think>\nLet me see: 2 < 3.\n</think>\n\nYes, 2 < 3.",
        False,
        "Let me see: 2 < 3.",
        "Yes, 2 < 3.",
    ),
    (
        THINK,
        "Primed, so no open marker.\n</think>\n\nAnswer.",
        True,
        "Primed, so no open marker.",
        "Answer.",
    ),
    (
        THINK,
        "  <think>a <think> b</thinking> c</think>Then </think> and <think>.",
        False,
        "a <think> b</thinking> c",
        "Then </think> and <think>.",
    ),
    (
        THINK,
        "Plain answer, <think> is only text here.",
        False,
        "",
        "Plain answer, <think> is only text here.",
    ),
    (THINK, "\n  <b>bold</b> answer", False, "", "\n  <b>bold</b> answer"),
    (THINK, "thinking that never ends \n <", True, "thinking that never ends \n <", ""),
    (THINK, "<think>cut off inside the close </thi", False, "cut off inside the close </thi", ""),
    (THINK, "<think>\n\n</think>\n\nEmpty thinking.", False, "", "Empty thinking."),
    (
        COMMAND,
        "<|START_THINKING|>Plan: greet.<|END_THINKING|>Hello!",
        False,
        "Plan: greet.",
        "Hello!",
    ),
    (MAGISTRAL, "[THINK]x [THINK] y[/THINK]\n[answer] z", False, "x [THINK] y", "[answer] z"),
    (SEED, "<seed:think>deep</seed:think>\nshallow", False, "deep", "shallow"),
    (
        HARMONY,
        "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final"
        "<|message|>Hi there",
        False,
        "User greets.",
        "Hi there",
    ),
    (HARMONY, "<|channel|>final<|message|>Straight to it.", False, "", "Straight to it."),
]


def _feed(style: ReasoningStyle, chunks: list[str], primed: bool) -> tuple[str, str]:
    s = ReasoningSplitter(style, primed=primed)
    pieces = [p for c in chunks for p in s.feed(c)] + s.finish()
    assert all(p.text for p in pieces), "no empty pieces"
    return (
        "".join(p.text for p in pieces if isinstance(p, ReasoningDelta)),
        "".join(p.text for p in pieces if isinstance(p, AnswerDelta)),
    )


@pytest.mark.parametrize(("style", "text", "primed", "thinking", "answer"), CASES)
def test_split_is_the_same_however_the_text_is_cut(
    style: ReasoningStyle, text: str, primed: bool, thinking: str, answer: str
) -> None:
    assert split_all(style, text, primed=primed) == (thinking, answer)
    assert _feed(style, list(text), primed) == (thinking, answer)  # char by char
    for i in range(len(text) + 1):  # every single boundary
        assert _feed(style, [text[:i], text[i:]], primed) == (thinking, answer), i
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _feed(style, chunks, primed) == (thinking, answer), chunks


def test_held_back_only_until_decided() -> None:
    s = ReasoningSplitter(THINK)
    assert s.feed("<thi") == []  # could still open the block
    assert s.feed("nk>Hmm") == [ReasoningDelta("Hmm")]
    assert s.feed(" ok \n</") == [ReasoningDelta(" ok")]  # whitespace may end the thinking
    assert s.feed("p> more") == [ReasoningDelta(" \n</p> more")]
    assert s.feed("</think>\n\n") == []
    assert s.feed("Done") == [AnswerDelta("Done")]
    assert s.feed(" <think>") == [AnswerDelta(" <think>")]  # the answer streams untouched
    plain = ReasoningSplitter(THINK)
    assert plain.feed("<") == []
    assert plain.feed("b>") == [AnswerDelta("<b>")]


def test_tokens_are_attributed_to_their_side() -> None:
    s = ReasoningSplitter(THINK)
    s.feed("<", 1)  # undecided: counted once the block opens
    s.feed("think>", 1)
    s.feed("a b c", 3)
    s.feed("</think>", 2)  # the close marker is thinking output
    s.feed("\n\nAnswer", 2)
    s.finish()
    assert s.reasoning_tokens == 7
    plain = ReasoningSplitter(THINK)
    plain.feed("<", 1)
    plain.feed("b> text", 3)
    assert plain.reasoning_tokens == 0
    primed = ReasoningSplitter(THINK, primed=True)
    primed.feed("x", 4)
    assert primed.reasoning_tokens == 4 and primed.in_reasoning


def test_reader_sends_the_answer_through_the_tool_parser() -> None:
    reader = _reader(THINK, True, ToolCallParser(HERMES, {"f"}))
    text = 'Need f.</think>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    events = [e for c in text for e in reader.feed(c)] + reader.finish()
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Need f."
    assert [e.name for e in events if isinstance(e, CallStarted)] == ["f"]
    done = [e for e in events if isinstance(e, CallFinished)]
    assert done and done[0].arguments == '{"a": 1}'
    assert not any(isinstance(e, TextDelta) for e in events)


def test_style_is_read_off_the_template() -> None:
    assert detect_style("{{ '<think>\\n' }}") is THINK
    assert detect_style("{% if '</think>' in c %}") is THINK
    assert detect_style("<|START_THINKING|>") is COMMAND
    assert detect_style("[THINK]") is MAGISTRAL
    assert detect_style("<seed:think>") is SEED
    assert detect_style("<|channel|>analysis<|message|>") is HARMONY
    assert detect_style("<|im_start|>assistant\n") is None


@pytest.mark.parametrize("effort", ["none", " OFF ", "Disabled", "false", "0"])
def test_disabling_efforts(effort: str) -> None:
    assert template_controls(effort) == {"enable_thinking": False}


def test_other_efforts_are_forwarded_verbatim() -> None:
    assert template_controls("low") == {"enable_thinking": True, "reasoning_effort": "low"}
    assert template_controls("Max") == {"enable_thinking": True, "reasoning_effort": "Max"}
    assert template_controls(None) == {} and template_controls("  ") == {}
    assert template_controls("high", effort_variable("{{ reasoning_strength }}")) == {
        "enable_thinking": True,
        "reasoning_strength": "high",
    }


# -- reasoning input items ------------------------------------------------------------------


def _rs(text: str, **extra: object) -> dict[str, object]:
    return {"type": "reasoning", "content": [{"type": "reasoning_text", "text": text}], **extra}


def test_reasoning_items_attach_to_the_following_assistant_turn() -> None:
    msgs = input_to_messages(
        [
            {"role": "user", "content": "q1"},
            _rs("think 1", summary=[]),
            _rs("think 2"),
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
            _rs("lost"),  # a user turn follows: dropped
            {"role": "user", "content": "q3"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "sum"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            _rs("trailing"),  # nothing follows: dropped
        ],
        lowering=Lowering("m"),
    )
    assert [(m.role, m.text, m.reasoning) for m in msgs] == [
        ("user", "q1", None),
        ("assistant", "a1", "think 1\nthink 2"),
        ("user", "q2", None),
        ("user", "q3", None),
        ("assistant", "", "sum"),
        ("tool", "ok", None),
    ]
    assert msgs[1].as_template_dict()["reasoning_content"] == "think 1\nthink 2"
    assert "reasoning_content" not in msgs[0].as_template_dict()


def test_reasoning_is_effective_input_only_on_an_assistant_turn() -> None:
    attached = input_to_messages(
        [{"role": "user", "content": " "}, _rs("why"), {"role": "assistant", "content": ""}],
        lowering=Lowering("m"),
    )
    require_effective_input(attached)
    with pytest.raises(InvalidRequest):
        require_effective_input(input_to_messages([_rs("alone")], lowering=Lowering("m")))


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "reasoning", "content": "text"}, "input[0].content"),
        (
            {"type": "reasoning", "content": [{"type": "output_text", "text": "x"}]},
            "input[0].content[0].type",
        ),
        (
            {"type": "reasoning", "content": [{"type": "reasoning_text"}]},
            "input[0].content[0].text",
        ),
        (
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": 3}]},
            "input[0].summary[0].text",
        ),
    ],
)
def test_malformed_reasoning_items_name_the_path(item: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        input_to_messages([item], lowering=Lowering("m"))
    assert err.value.param == param


# -- the event machine ----------------------------------------------------------------------


def _machine() -> ResponseEventMachine:
    req = CreateResponseRequest(model="m", input="hi", reasoning={"effort": "low"})
    return ResponseEventMachine(build_echo(req, SamplingParams(), FakeEngine(model_id="m")))


def _wire(events: list) -> list[dict]:  # type: ignore[type-arg]
    wire = [e.model_dump(mode="json", exclude_unset=True) for e in events]
    for e in wire:
        strict_event(e)
    assert [e["sequence_number"] for e in wire] == list(range(len(wire)))
    return wire


def test_reasoning_then_text_event_order() -> None:
    m = _machine()
    reader = _reader(THINK, True, None)
    events = m.start()
    for chunk in ["Think", "ing.</th", "ink>\n\nHel", "lo"]:
        events += m.apply_all(reader.feed(chunk, 1))
        if chunk == "Think":
            live = m.snapshot()  # a poll mid-thinking shows the partial reasoning
            assert live.output[0].type == "reasoning"
            assert live.output[0].content and live.output[0].content[0].text == "Think"
    events += m.apply_all(reader.finish())
    events += m.finish(usage=Usage(4, 4, reasoning_tokens=reader.reasoning_tokens))
    wire = _wire(events)
    assert [e["type"] for e in wire] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert wire[2]["item"]["type"] == "reasoning" and wire[2]["item"]["id"].startswith("rs_")
    assert wire[2]["item"]["summary"] == [] and wire[3]["part"]["type"] == "reasoning_text"
    assert wire[6]["text"] == "Thinking." and wire[7]["part"]["text"] == "Thinking."
    assert all(e["output_index"] == 0 for e in wire[2:9])
    assert all(e["output_index"] == 1 for e in wire[9:16])
    final = strict_response(wire[-1]["response"])
    assert [o.type for o in final.output] == ["reasoning", "message"]
    rs = final.output[0]
    assert rs.type == "reasoning" and rs.status == "completed" and rs.summary == []
    assert rs.content and [c.model_dump() for c in rs.content] == [
        {"type": "reasoning_text", "text": "Thinking."}
    ]
    assert final.output_text == "Hello"
    assert final.usage and final.usage.output_tokens_details.reasoning_tokens == 3
    assert final.reasoning and final.reasoning.effort == "low"
    assert m.snapshot() == final


def test_budget_spent_while_thinking_leaves_only_the_reasoning_item() -> None:
    m = _machine()
    reader = _reader(THINK, True, None)
    events = m.start() + m.apply_all(reader.feed("still thinking", 5))
    events += m.apply_all(reader.finish())
    events += m.finish(usage=Usage(3, 5, reasoning_tokens=5), incomplete_reason="max_output_tokens")
    wire = _wire(events)
    assert [e["type"] for e in wire][-4:] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert not any(e["type"].startswith("response.output_text") for e in wire)
    final = strict_response(wire[-1]["response"])
    assert final.status == "incomplete"
    assert final.incomplete_details and final.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in final.output] == [("reasoning", "incomplete")]
    assert final.output_text == ""


def test_thinking_with_no_answer_still_completes_with_an_empty_message() -> None:
    m = _machine()
    events = m.start() + m.apply_all([ReasoningDelta("only this")])
    events += m.finish(usage=Usage(1, 1))
    final = strict_response(_wire(events)[-1]["response"])
    assert [(o.type, o.status) for o in final.output] == [
        ("reasoning", "completed"),
        ("message", "completed"),
    ]


def test_grammar_on_a_primed_block_admits_bounded_thinking_first() -> None:
    answer = 'root ::= answer-root\nanswer-root ::= "{" "}"'
    g = reasoning_first_grammar(answer, "</think>", 128)
    lines = g.splitlines()
    assert lines[0] == 'root ::= respd-think "</think>" respd-think-gap respd-answer'
    assert lines[1] == "respd-think ::= [^< \\t\\n\\r] [^<]{0,127}"
    assert "respd-answer ::= answer-root" in lines
    assert 'answer-root ::= "{" "}"' in lines  # only the root rule is renamed
    assert sum(line.startswith("root ::=") for line in lines) == 1
    magistral = reasoning_first_grammar(answer, "[/THINK]", 4).splitlines()[1]
    assert magistral == "respd-think ::= [^\\[ \\t\\n\\r] [^\\[]{0,3}"


@pytest.mark.parametrize("primed", [False, True])
@pytest.mark.parametrize("with_parser", [False, True], ids=["plain", "tool-parser"])
@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 64])
def test_reader_text_offsets_index_the_fed_text(primed: bool, with_parser: bool, step: int) -> None:
    """Every answer `TextDelta` says where its text lies in what the reader was fed (the
    logprob aligner relies on it), through the tool parser too, at any chunking."""
    answer = 'Sure. <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> Done: <tool'
    fed = ("" if primed else "<think>") + "  a <b> c\n</think>\n\n" + answer
    parser = ToolCallParser(HERMES, {"f"}, None) if with_parser else None
    reader = _reader(THINK, primed, parser)
    events = []
    for i in range(0, len(fed), step):
        events += reader.feed(fed[i : i + step], 1)
    events += reader.finish()
    texts = [e for e in events if isinstance(e, TextDelta)]
    assert texts
    for e in texts:
        assert e.start >= 0 and fed[e.start : e.start + len(e.text)] == e.text, (e, fed)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "a <b> c"
    if with_parser:
        assert [e.name for e in events if isinstance(e, CallStarted)] == ["f"]
        alone = ToolCallParser(HERMES, {"f"}, None)
        bare = alone.feed(answer) + alone.finish()
        expected = "".join(e.text for e in bare if isinstance(e, TextDelta))
        assert "".join(t.text for t in texts) == expected
    else:
        assert "".join(t.text for t in texts) == answer
