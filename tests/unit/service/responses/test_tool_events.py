"""Function-call items in the event machine, driven by the tool-call parser, without a model."""

from __future__ import annotations

from respd.engines.base import SamplingParams
from respd.engines.fake import FakeEngine
from respd.engines.families.tools import HERMES
from respd.protocol.responses import CreateResponseRequest
from respd.service.generation.output import Usage
from respd.service.generation.toolcalls import ToolCallParser
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import build_echo
from tests.support.sdk_types import strict_event, strict_response

OUTPUT = (
    "Checking both.\n<tool_call>\n"
    '{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n'
    '{"name": "b", "arguments": {"y": "two"}}\n</tool_call>'
)


def _run(text: str, step: int) -> tuple[list[dict], ResponseEventMachine]:  # type: ignore[type-arg]
    req = CreateResponseRequest(model="m", input="hi", tools=[])
    m = ResponseEventMachine(build_echo(req, SamplingParams(), FakeEngine(model_id="m")))
    parser = ToolCallParser(HERMES, {"a", "b"})
    events = m.start()
    for i in range(0, len(text), step):
        events += m.apply_all(parser.feed(text[i : i + step]))
    events += m.apply_all(parser.finish())
    events += m.finish(usage=Usage(input_tokens=3, output_tokens=9))
    wire = [e.model_dump(mode="json", exclude_unset=True) for e in events]
    for e in wire:
        strict_event(e)
    return wire, m


def test_text_before_calls_is_its_own_message_and_indices_are_contiguous() -> None:
    wire, m = _run(OUTPUT, 2)
    assert [e["sequence_number"] for e in wire] == list(range(len(wire)))
    added = [e for e in wire if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"),
        (1, "function_call"),
        (2, "function_call"),
    ]
    final = strict_response(wire[-1]["response"])
    assert [o.type for o in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == "Checking both."
    assert final.output[0].type == "message" and final.output[0].phase == "commentary"
    calls = final.output[1:]
    assert [(c.name, c.arguments) for c in calls] == [("a", '{"x": 1}'), ("b", '{"y": "two"}')]
    assert len({c.call_id for c in calls}) == 2
    # the message closes before the first call opens
    types = [e["type"] for e in wire]
    assert types.index("response.output_item.done") < types.index("response.output_item.added", 3)
    for call in calls:
        deltas = [
            e["delta"]
            for e in wire
            if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == call.id
        ]
        assert len(deltas) > 1 and "".join(deltas) == call.arguments
    assert m.snapshot() == final


def test_calls_only_output_has_no_message() -> None:
    wire, _ = _run(OUTPUT[len("Checking both.\n") :], 1)
    final = strict_response(wire[-1]["response"])
    assert [o.type for o in final.output] == ["function_call", "function_call"]


def test_cut_off_call_is_incomplete() -> None:
    req = CreateResponseRequest(model="m", input="hi")
    m = ResponseEventMachine(build_echo(req, SamplingParams(), FakeEngine(model_id="m")))
    parser = ToolCallParser(HERMES, {"a"})
    events = m.start() + m.apply_all(parser.feed('<tool_call>{"name": "a", "arguments": {"x"'))
    events += m.apply_all(parser.finish())
    events += m.finish(usage=Usage(), incomplete_reason="max_output_tokens")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "incomplete"
    assert final.output[0].type == "function_call" and final.output[0].status == "incomplete"


def test_a_message_that_ends_the_response_is_its_final_answer() -> None:
    wire, _ = _run("Just text.", 3)
    final = strict_response(wire[-1]["response"])
    assert final.output[0].type == "message" and final.output[0].phase == "final_answer"
    (done,) = [e for e in wire if e["type"] == "response.output_item.done"]
    assert done["item"]["phase"] == "final_answer"
