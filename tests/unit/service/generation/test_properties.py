"""Property-based tests of the output reading: whatever the text and wherever the chunks
fall, the tool-call parser, the thinking splitter, stop sequences and the whole reader give
the same reading, lose no character and never raise. And input translation turns arbitrary
items into messages or a clean 400, never anything else."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from respd.engines.base import TokenChunk
from respd.engines.families.profile import ModelProfile
from respd.engines.families.reasoning import HARMONY, STYLES, THINK, ReasoningStyle
from respd.engines.families.tools import FORMATS, HERMES, ToolFormat
from respd.engines.messages import Image, TextPart
from respd.protocol.errors import APIError
from respd.service.generation.output import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    ReasoningDelta,
    TextDelta,
)
from respd.service.generation.reader import OutputReader
from respd.service.generation.stops import StopMatcher
from respd.service.generation.thinking import ReasoningSplitter, split_all
from respd.service.generation.toolcalls import ToolCallParser
from respd.service.media.lowering import Lowering
from respd.service.responses.translate import input_to_messages

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text built from the pieces markers are made of, so markers (whole, split, broken) appear
# often, plus arbitrary unicode.
PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "[TOOL_CALLS]",
    "<|python_tag|>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "parameters": {}}',
    "{",
    "}",
    '"',
    ",",
    ":",
    "\n",
    " ",
    "<",
    ">",
    "STOP",
    "hello",
]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=25).map("".join)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


cuts = st.lists(st.integers(min_value=0, max_value=500), max_size=30)


def _calls_and_text(events: list[Any]) -> tuple[str, list[tuple[str, str, bool]]]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(e.name, e.arguments, e.complete) for e in events if isinstance(e, CallFinished)]
    return text, calls


@FAST
@given(text=texts, cut=cuts, fmt=st.sampled_from(sorted(FORMATS)))
# A repeated "name" key, cut between the two: the whole text once read the last one.
@example(text='{"name": "f", "name": "x"}', cut=[13], fmt="llama3")
def test_tool_parser_reading_does_not_depend_on_chunking(
    text: str, cut: list[int], fmt: str
) -> None:
    def read(pieces: list[str]) -> list[Any]:
        parser = ToolCallParser(FORMATS[fmt], {"f", "g"})
        events: list[Any] = []
        for piece in pieces:
            events += parser.feed(piece)
        return events + parser.finish()

    whole = read([text])
    parts = read(chunked(text, cut))
    assert _calls_and_text(parts) == _calls_and_text(whole)
    for e in parts:
        if isinstance(e, TextDelta):
            assert text[e.start : e.start + len(e.text)] == e.text
    for fin in (e for e in parts if isinstance(e, CallFinished)):
        streamed = "".join(
            e.delta for e in parts if isinstance(e, ArgumentsDelta) and e.index == fin.index
        )
        assert streamed == fin.arguments
        assert any(isinstance(e, CallStarted) and e.index == fin.index for e in parts)


@FAST
@given(
    text=texts,
    cut=cuts,
    style=st.sampled_from(sorted(STYLES)),
    primed=st.booleans(),
)
def test_splitter_loses_nothing_but_markers(
    text: str, cut: list[int], style: str, primed: bool
) -> None:
    s: ReasoningStyle = STYLES[style]
    whole = split_all(s, text, primed=primed)
    splitter = ReasoningSplitter(s, primed=primed)
    pieces = [p for piece in chunked(text, cut) for p in splitter.feed(piece)] + splitter.finish()
    thinking = "".join(p.text for p in pieces if isinstance(p, ReasoningDelta))
    answer = "".join(p.text for p in pieces if not isinstance(p, ReasoningDelta))
    assert (thinking, answer) == whole
    # Every character of the answer and the thinking comes from the text, in order.
    for part in (thinking, answer):
        assert len(part) <= len(text)
    if s is not HARMONY and not primed and s.open not in text:
        assert thinking == "" and answer.strip() == text.strip()


@FAST
@given(text=texts, cut=cuts, stops=st.lists(st.text(min_size=1, max_size=5), max_size=4))
def test_stop_matcher_cuts_at_the_first_stop_whatever_the_chunking(
    text: str, cut: list[int], stops: list[str]
) -> None:
    matcher = StopMatcher(stops)
    out = ""
    for piece in chunked(text, cut):
        out += matcher.feed(piece)
        if matcher.stopped:
            break
    out += matcher.flush()
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    assert out == expected


@FAST
@given(
    text=texts,
    cut=cuts,
    think=st.booleans(),
    stops=st.lists(st.sampled_from(["STOP", "\n\n"]), max_size=2),
)
def test_reader_never_raises_and_keeps_calls_well_formed(
    text: str, cut: list[int], think: bool, stops: list[str]
) -> None:
    profile = ModelProfile(
        tool_format=HERMES, tools_native=True, reasoning=THINK if think else None
    )
    reader = OutputReader(profile, tool_names={"f"}, stops=stops, logprobs=True)
    events: list[Any] = []
    for piece in chunked(text, cut):
        events += reader.feed(TokenChunk(piece, [1]))
        if reader.stopped:
            break
    events += reader.finish()
    started = {e.index for e in events if isinstance(e, CallStarted)}
    finished = {e.index for e in events if isinstance(e, CallFinished)}
    assert started == finished  # every call that started also ended
    for e in events:
        if isinstance(e, CallStarted):
            assert e.name == "f"  # only offered functions are calls


item_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["type", "role", "content", "text", "call_id", "output", "name", "arguments"]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)
items = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(
                ["message", "function_call", "function_call_output", "reasoning", "other"]
            )
            | item_values,
            "role": st.sampled_from(["user", "assistant", "system", "developer", "x"])
            | item_values,
            "content": st.text(max_size=10) | item_values,
            "call_id": st.text(max_size=4),
            "name": st.text(max_size=4),
            "output": item_values,
        },
    )
    | item_values,
    max_size=5,
)


@FAST
@given(value=items)
def test_translation_is_messages_or_a_clean_400(value: Any) -> None:
    try:
        messages = input_to_messages(value, lowering=Lowering("m"))
    except APIError as exc:
        assert exc.status_code == 400 and exc.param is not None
        assert exc.param == "input" or exc.param.startswith("input[")
    else:
        for m in messages:  # ordered parts, each text or an image, never raw input
            assert all(isinstance(part, TextPart | Image) for part in m.content)
            assert isinstance(m.text, str)


def test_the_fixed_families_cover_every_format() -> None:
    # The properties above sample every format and style; keep them all in sight.
    assert set(FORMATS) == {"hermes", "generic", "llama3", "mistral"}
    assert isinstance(HERMES, ToolFormat)
