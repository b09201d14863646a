"""Runaway turns, on the fake engine: the repetition stop (a property against a brute-force
reference; a loop ends the turn as incomplete on both APIs, logged and counted; verbatim
copies and lists stay exact), the default output cap per model (applied when a request sets
none, shown in /v1/models, liftable) and the DRY request fields (handed to the engine,
bad values are 400s naming the field)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.generation.policy import MAX_SPAN, MIN_SPAN, REPEATS, OutputPolicy
from respd.service.generation.repetition import RepetitionStop
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_event, strict_response
from tests.unit.api.test_metrics import scrape, value

LOOP = "I am a helpful assistant and I am here to help. "  # 48 characters


def looped_reference(text: str, repeats: int = REPEATS) -> bool:
    """Whether `text` ends with `repeats` copies in a row of one span of MIN_SPAN..MAX_SPAN
    characters (or a shorter period's smallest multiple of at least MIN_SPAN)."""
    for period in range(1, MAX_SPAN + 1):
        span = period * -(-MIN_SPAN // period)
        need = repeats * span
        if span <= MAX_SPAN * 2 and len(text) >= need:
            tail = text[len(text) - need :]
            if all(tail[i] == tail[i - period] for i in range(period, need)):
                return True
    return False


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


# -- the detector ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet="ab c.\n", min_size=0, max_size=400),
    st.lists(st.integers(0, 400), max_size=12),
)
def test_the_stop_agrees_with_a_brute_force_reference(text: str, cuts: list[int]) -> None:
    stop = RepetitionStop(REPEATS)
    fired = False
    so_far = ""
    for piece in chunked(text, cuts):
        so_far += piece
        fired = fired or looped_reference(so_far)
        assert stop.feed(piece) == fired


@settings(max_examples=60, deadline=None)
@given(st.lists(st.characters(codec="utf-8"), unique=True, min_size=0, max_size=300))
def test_the_stop_never_fires_on_text_that_does_not_repeat(chars: list[str]) -> None:
    text = "".join(chars)
    stop = RepetitionStop(REPEATS)
    assert not stop.feed(text)
    # ... nor on a span repeated one time fewer than needed.
    span = text[:MIN_SPAN]
    if len(span) == MIN_SPAN:
        assert not RepetitionStop(REPEATS).feed(span * (REPEATS - 1))


@settings(max_examples=60, deadline=None)
@given(
    st.text(min_size=0, max_size=200),
    st.text(min_size=MIN_SPAN, max_size=MAX_SPAN),
    st.lists(st.integers(0, 4000), max_size=8),
)
def test_the_stop_fires_on_a_span_repeated_k_times(before: str, span: str, cuts: list[int]) -> None:
    stop = RepetitionStop(REPEATS)
    for piece in chunked(before + span * REPEATS, cuts):
        stop.feed(piece)
    assert stop.fired


def test_lists_tables_and_rules_are_not_loops() -> None:
    text = (
        "Here are the steps:\n"
        + "".join(f"{i}. Add the item number {i} to the list.\n" for i in range(1, 30))
        + "| a | b | c |\n|---|---|---|\n"
        + "".join(f"| {i} | {i * 2} | {i * 3} |\n" for i in range(20))
        + "=" * 80
        + "\n"
        + "ha " * 10
    )
    assert not RepetitionStop(REPEATS).feed(text)
    assert not RepetitionStop(0).feed(LOOP * 20)  # 0: off


# -- a loop ends the turn -------------------------------------------------------------------


def loop_reply(copies: int = 30) -> Reply:
    return Reply([LOOP[i : i + 4] for _ in range(copies) for i in range(0, len(LOOP), 4)])


async def test_a_looping_turn_ends_incomplete_and_is_counted(
    engine: FakeEngine,
    sdk: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine.add(loop_reply(), loop_reply(), loop_reply())
    resp = strict_response((await sdk.responses.create(model=FAKE_MODEL, input="hi")).to_dict())
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text.count(LOOP.strip()) <= REPEATS + 1
    assert resp.usage is not None and resp.usage.output_tokens < 30 * 12
    assert "generation stopped: repetition" in caplog.text

    stream = await sdk.responses.create(model=FAKE_MODEL, input="hi", stream=True)
    events = [strict_event(e.to_dict()) async for e in stream]
    assert events[-1].type == "response.incomplete"

    chat = await sdk.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].finish_reason == "length"
    samples = await scrape(http)
    assert value(samples, "respd_repetition_stops_total", api="responses") == 2
    assert value(samples, "respd_repetition_stops_total", api="chat") == 1


async def test_a_verbatim_tool_call_copy_stays_exact(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    # The user's text, with a phrase said three times, copied whole into a call's arguments.
    note = ("Remember to water the plants on the balcony. " * 3) + "Then lock the door."
    arguments = json.dumps({"text": note})
    call = f'<tool_call>\n{{"name": "save_note", "arguments": {arguments}}}\n</tool_call>'
    engine.add(Reply([call[i : i + 3] for i in range(0, len(call), 3)]))
    tool = {
        "type": "function",
        "name": "save_note",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
    resp = await sdk.responses.create(
        model=FAKE_MODEL,
        input=f"Save this note: {note}",
        tools=[tool],  # type: ignore[list-item]
    )
    assert resp.status == "completed"
    calls = [o for o in resp.output if o.type == "function_call"]
    assert len(calls) == 1 and json.loads(calls[0].arguments) == {"text": note}


async def test_a_looping_structured_answer_is_closed_and_still_parses(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    # A string value that loops: the engine is asked to close the value instead of being cut.
    looping = ['{"name": "', *(["john_"] * 60), '", "age": 3}']
    closing = ['", "age": 0}']
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "p", "strict": True, "schema": schema}
    engine.add(Reply(looping, closing=closing), Reply(looping, closing=closing))
    resp = strict_response(
        (await sdk.responses.create(model=FAKE_MODEL, input="hi", text={"format": fmt})).to_dict()
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    value_ = json.loads(resp.output_text)
    assert value_["age"] == 0 and value_["name"].startswith("john_john_")
    assert len(value_["name"]) < 60 * len("john_")

    chat = await sdk.chat.completions.create(
        model=FAKE_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    assert chat.choices[0].finish_reason == "length"
    assert json.loads(chat.choices[0].message.content or "")["age"] == 0
    assert [c.wrapped for c in engine.calls] == [True, True]
    samples = await scrape(http)
    assert value(samples, "respd_repetition_stops_total", api="responses") == 1
    assert value(samples, "respd_repetition_stops_total", api="chat") == 1


async def test_a_loop_that_cannot_close_is_cut(engine: FakeEngine, sdk: openai.AsyncOpenAI) -> None:
    engine.add(loop_reply())  # no `closing`: the engine cannot close its output
    resp = await sdk.responses.create(model=FAKE_MODEL, input="hi")
    assert resp.status == "incomplete"
    [call] = engine.calls
    assert call.wrapped and call.cancelled


# -- the default output cap -----------------------------------------------------------------


async def test_the_default_cap_is_a_quarter_of_the_context_and_a_request_lifts_it(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    engine.add("Hi.", "Hi.")
    await sdk.responses.create(model=FAKE_MODEL, input="hi")
    await sdk.responses.create(model=FAKE_MODEL, input="hi", max_output_tokens=3000)
    default, asked = (c.params.max_tokens for c in engine.calls)
    assert default == engine.context_window // 4
    assert asked == 3000
    card = (await http.get(f"/v1/models/{FAKE_MODEL}")).json()
    assert card["max_output_tokens"] == engine.context_window // 4
    listed = (await http.get("/v1/models")).json()["data"][0]
    assert listed["max_output_tokens"] == engine.context_window // 4


@pytest.mark.parametrize(("configured", "expected"), [(0, None), (100, 100)])
async def test_the_operator_sets_or_lifts_the_cap(configured: int, expected: int | None) -> None:
    engine = FakeEngine(["Hi."], model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore(), output=OutputPolicy(max_tokens=configured))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        card = (await http.get("/v1/models")).json()["data"][0]
        body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert card["max_output_tokens"] == expected
    # No cap: the engine runs to its end of turn or the end of its context.
    assert engine.calls[0].params.max_tokens == expected


async def test_a_long_prompt_is_not_refused_for_the_default_cap(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add("Hi.")
    # The fake engine's tokens are bytes: this leaves less room than the default cap.
    resp = await sdk.responses.create(
        model=FAKE_MODEL, input="w" * (engine.context_window * 4 // 5)
    )
    assert resp.status == "completed"
    room = engine.context_window - engine.calls[0].prompt.n_tokens
    assert engine.calls[0].params.max_tokens == min(room, engine.context_window // 4)


async def test_a_turn_that_fills_the_window_is_logged_and_counted(
    engine: FakeEngine,
    sdk: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    window = engine.context_window
    counting = [f"{i}, " for i in range(window)]  # no span repeats: no loop cuts it
    engine.add(Reply(counting), Reply(counting))
    capped = await sdk.responses.create(model=FAKE_MODEL, input="hi")  # the cap ends it
    # A long prompt leaves less room than the cap: the window's end is what ends this one.
    filled = await sdk.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "w" * (window * 4 // 5)}]
    )
    assert capped.status == "incomplete" and filled.choices[0].finish_reason == "length"
    assert filled.usage is not None and filled.usage.total_tokens >= window
    samples = await scrape(http)
    assert value(samples, "respd_context_end_stops_total", api="responses") == 0
    assert value(samples, "respd_context_end_stops_total", api="chat") == 1
    assert caplog.text.count("generation stopped: context end") == 1


# -- DRY ------------------------------------------------------------------------------------

DRY = {
    "dry_multiplier": 0.8,
    "dry_base": 2.0,
    "dry_allowed_length": 3,
    "dry_penalty_last_n": 256,
    "dry_sequence_breakers": ["\n", ";"],
}


async def test_dry_fields_reach_the_engine_on_both_apis(
    engine: FakeEngine, sdk: openai.AsyncOpenAI
) -> None:
    engine.add("Hi.", "Hi.", "Hi.")
    await sdk.responses.create(model=FAKE_MODEL, input="hi", extra_body=DRY)
    await sdk.chat.completions.create(
        model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=DRY
    )
    await sdk.responses.create(model=FAKE_MODEL, input="hi")
    for call in engine.calls[:2]:
        assert {name: getattr(call.params, name) for name in DRY} == DRY
    assert engine.calls[2].params.dry_multiplier is None  # the engine's default


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"dry_multiplier": -0.5}, "dry_multiplier"),
        ({"dry_base": 0.5}, "dry_base"),
        ({"dry_allowed_length": 0}, "dry_allowed_length"),
        ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
        ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": ["x" * 41]}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
        ({"dry_multiplier": "lots"}, "dry_multiplier"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
async def test_bad_dry_values_are_400s_naming_the_field(
    http: httpx.AsyncClient, engine: FakeEngine, path: str, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"model": FAKE_MODEL}
    if path == "/v1/responses":
        body["input"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    r = await http.post(path, json=body | extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert not engine.calls


# -- the flags ------------------------------------------------------------------------------


def test_the_flags_make_the_policy_and_the_dry_defaults() -> None:
    from pydantic import ValidationError

    from respd.config.settings import Settings

    s = Settings(max_output_tokens=0, repetition_stop=6, dry_sequence_breakers='["\\n", ";"]')
    assert s.output_policy() == OutputPolicy(max_tokens=0, repetition_stop=6)
    assert s.dry_breakers() == ["\n", ";"]
    assert s.sampling_overrides(embedded_model=True)["dry_multiplier"] == 0.8
    assert "dry_multiplier" not in s.sampling_overrides(embedded_model=False)
    assert Settings(dry_multiplier=0).sampling_overrides(embedded_model=True)["dry_multiplier"] == 0
    assert Settings().dry_breakers() is None
    for bad in ('"\\n"', "[1]", "not json"):
        with pytest.raises(ValidationError):
            Settings(dry_sequence_breakers=bad)
