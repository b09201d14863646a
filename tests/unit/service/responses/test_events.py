"""The event state machine and stop matcher, without a model."""

from __future__ import annotations

from openai.types.responses import Response

from respd.engines.base import SamplingParams
from respd.engines.fake import FakeEngine
from respd.protocol.responses import CreateResponseRequest
from respd.service.generation.output import Usage
from respd.service.generation.stops import StopMatcher
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import build_echo
from tests.support.sdk_types import strict_event, strict_response


def _machine() -> ResponseEventMachine:
    req = CreateResponseRequest(model="m", input="hi", instructions="sys", metadata={"a": "b"})
    return ResponseEventMachine(build_echo(req, SamplingParams(), FakeEngine(model_id="m")))


def _dump(events: list) -> list[dict]:  # type: ignore[type-arg]
    return [e.model_dump(mode="json", exclude_unset=True) for e in events]


def test_text_sequence_numbers_and_final_object() -> None:
    m = _machine()
    events = m.start() + m.output_text("Hel") + m.output_text("") + m.output_text("lo")
    events += m.finish(usage=Usage(input_tokens=5, output_tokens=2, cached_tokens=1))
    wire = _dump(events)
    for e in wire:
        strict_event(e)
    assert [e["sequence_number"] for e in wire] == list(range(len(wire)))
    assert [e["type"] for e in wire] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = strict_response(wire[-1]["response"])
    assert final.output_text == "Hello"
    assert final.status == "completed" and final.completed_at is not None
    assert final.instructions == "sys" and final.metadata == {"a": "b"}
    assert final.usage and final.usage.total_tokens == 7
    assert final.usage.input_tokens_details.cached_tokens == 1
    # The snapshot after the fact is the same object the terminal event carried.
    assert m.snapshot() == Response.model_validate(wire[-1]["response"])
    created = strict_response(wire[0]["response"])
    assert created.status == "in_progress" and created.output == [] and created.usage is None


def test_incomplete_and_empty_output() -> None:
    m = _machine()
    events = _dump(m.start() + m.finish(usage=Usage(1, 0), incomplete_reason="max_output_tokens"))
    assert events[-1]["type"] == "response.incomplete"
    final = strict_response(events[-1]["response"])
    assert final.incomplete_details and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"  # an empty message item is still closed
    assert final.completed_at is None


def test_failure_keeps_partial_output() -> None:
    m = _machine()
    events = _dump(m.start() + m.output_text("par") + m.fail("boom"))
    assert events[-1]["type"] == "response.failed"
    final = strict_response(events[-1]["response"])
    assert final.status == "failed" and final.error and final.error.code == "server_error"
    assert final.output_text == "par"


def test_stop_matcher_holds_back_partial_matches() -> None:
    sm = StopMatcher(["END"])
    assert sm.feed("abc E") == "abc "
    assert sm.feed("N") == ""
    assert sm.feed("x") == "ENx"
    assert sm.feed("yy EN") == "yy "
    assert sm.feed("D and more") == ""
    assert sm.stopped
    assert sm.flush() == ""
    sm2 = StopMatcher(["\n\n", "###"])
    assert sm2.feed("a\n") == "a"
    assert sm2.flush() == "\n"
    assert StopMatcher([]).feed("anything") == "anything"
