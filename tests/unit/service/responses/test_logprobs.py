"""Logprobs attribution in the Responses event machine: through the tool-call parser and
across tokens whose text is not complete yet (no model)."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseTextDeltaEvent

from respd.engines.base import SamplingParams, TokenChunk, TokenLogprob, TopLogprob
from respd.engines.fake import FakeEngine
from respd.engines.families.profile import ModelProfile
from respd.engines.families.tools import HERMES
from respd.protocol.responses import CreateResponseRequest
from respd.service.generation.output import Usage
from respd.service.generation.reader import OutputReader
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import build_echo
from tests.support.logprobs import part_logprobs


def _lp(piece: str, value: float) -> TokenLogprob:
    raw = list(piece.encode())
    return TokenLogprob(piece, raw, value, [TopLogprob(piece, raw, value)])


def test_parser_path_gives_message_text_its_own_tokens() -> None:
    tokens = ["Sure", ",", " here", ".\n<", "tool_call", ">\n", '{"name": "a", ', '"arguments"']
    tokens += [": {}}", "\n</tool_call>"]
    req = CreateResponseRequest(model="m", input="hi", tools=[])
    machine = ResponseEventMachine(build_echo(req, SamplingParams(logprobs=1), FakeEngine()))
    profile = ModelProfile(tool_format=HERMES, tools_native=True)
    reader = OutputReader(profile, tool_names={"a"}, logprobs=True)
    events = machine.start()
    for i, tok in enumerate(tokens):
        events += machine.apply_all(reader.feed(TokenChunk(tok, [i], [_lp(tok, -0.1 * (i + 1))])))
    events += machine.apply_all(reader.finish())
    events += machine.finish(usage=Usage(input_tokens=1, output_tokens=len(tokens)))
    resp = machine.snapshot()
    assert resp.output[0].type == "message" and resp.output[1].type == "function_call"
    lps = part_logprobs(resp)
    assert resp.output_text == "Sure, here."
    # ".\n<" is only partly message text: left out, like the marker's and the call's tokens
    assert [lp.token for lp in lps] == ["Sure", ",", " here"]
    assert [lp.logprob for lp in lps] == pytest.approx([-0.1, -0.2, -0.3])
    streamed = [
        lp.model_dump()
        for e in events
        if isinstance(e, ResponseTextDeltaEvent)
        for lp in e.logprobs
    ]
    assert streamed == [lp.model_dump() for lp in lps]


def test_tokens_without_text_yet_join_the_next_delta() -> None:
    """A character split over tokens: the first token's text is empty until the second."""
    req = CreateResponseRequest(model="m", input="hi")
    machine = ResponseEventMachine(build_echo(req, SamplingParams(logprobs=0), FakeEngine()))
    events = machine.start()
    a = TokenLogprob("\ufffd", [0xF0, 0x9F], -0.5)
    b = TokenLogprob("\ufffd", [0x98, 0x80], -0.25)
    events += machine.output_text("", [a]) + machine.output_text("\U0001f600", [b])
    events += machine.finish(usage=Usage(input_tokens=1, output_tokens=2))
    (delta,) = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert [lp.logprob for lp in delta.logprobs] == [-0.5, -0.25]
    lps = part_logprobs(machine.snapshot())
    assert b"".join(bytes(lp.bytes) for lp in lps).decode() == "\U0001f600"
