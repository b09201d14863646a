"""State sealed for the client: encrypted reasoning across `store: false` turns and
compaction items, over the app and the fake engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from respd.api.app import create_app
from respd.engines.base import Prompt, SamplingParams
from respd.engines.fake import FakeEngine, Reply
from respd.service.responses.text_items import summarize_reasoning
from respd.service.responses.translate import SUMMARY_HEADER
from respd.service.sealing import Sealer, Unsealable
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_compacted, strict_event, strict_response
from tests.support.servers import TEMPLATES

THOUGHT = "The user greets; greet back."


def test_sealed_blobs_open_only_unaltered_under_their_key_and_kind() -> None:
    a = Sealer.from_secret("k")
    secret = "a thought nobody else may read"  # too long to turn up in base64 by chance
    token = a.seal("reasoning", {"text": secret})
    assert "nobody" not in token
    assert Sealer.from_secret("k").open("reasoning", token) == {"text": secret}
    assert a.seal("reasoning", {"text": secret}) != token  # a fresh nonce each time
    with pytest.raises(Unsealable):
        Sealer.from_secret("other").open("reasoning", token)
    with pytest.raises(Unsealable):
        a.open("compaction", token)
    flipped = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    with pytest.raises(Unsealable):
        a.open("reasoning", flipped)
    for junk in ("", "%%%", "AAAA"):
        with pytest.raises(Unsealable):
            a.open("reasoning", junk)


def test_the_data_dir_key_is_made_once_and_kept_private(tmp_path: Any) -> None:
    token = Sealer.from_data_dir(tmp_path).seal("x", {"n": 1})
    assert Sealer.from_data_dir(tmp_path).open("x", token) == {"n": 1}
    assert (tmp_path / "state.key").stat().st_mode & 0o077 == 0


class Model:
    """Thinks, then answers; asked to summarise, it summarises."""

    def respond(self, prompt: Prompt, params: SamplingParams) -> Reply:
        system = prompt.request.messages[0].text
        if system.startswith("You compact"):
            return Reply(["The user said hi; ", "the assistant greeted."])
        return Reply([THOUGHT, "</think>", "Hello!"])  # the template opens the block


@pytest.fixture()
def engine() -> FakeEngine:
    template = (TEMPLATES / "think.jinja").read_text()
    return FakeEngine(respond=Model().respond, model_id=FAKE_MODEL, template=template)


async def _post(http: httpx.AsyncClient, path: str, **body: Any) -> httpx.Response:
    return await http.post(path, json={"model": FAKE_MODEL, **body})


async def test_encrypted_reasoning_comes_back_as_the_reasoning_it_sealed(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    r = await _post(
        http,
        "/v1/responses",
        input="hi",
        store=False,
        include=["reasoning.encrypted_content"],
    )
    assert r.status_code == 200, r.text
    first = strict_response(r.json())
    item = first.output[0]
    assert item.type == "reasoning" and item.encrypted_content
    assert THOUGHT not in item.encrypted_content
    # the client keeps only the sealed blob and sends it back with the history
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": item.encrypted_content}
    history = [
        {"role": "user", "content": "hi"},
        sealed,
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "again"},
    ]
    r = await _post(http, "/v1/responses", input=history, store=False)
    assert r.status_code == 200, r.text
    assistant = engine.calls[-1].prompt.request.messages[1]
    assert assistant.role == "assistant" and assistant.reasoning == THOUGHT
    # without the include, no blob
    plain = strict_response((await _post(http, "/v1/responses", input="hi")).json())
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None


async def test_tampered_or_foreign_blobs_are_400_and_nothing_runs(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    foreign = Sealer.from_secret("another server").seal("reasoning", {"text": "x"})
    for blob in (foreign, foreign[:-4] + "AAAA"):
        item = {"type": "reasoning", "summary": [], "encrypted_content": blob}
        r = await _post(http, "/v1/responses", input=[item, {"role": "user", "content": "q"}])
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (
            "input[0].encrypted_content",
            "invalid_encrypted_content",
        )
    assert engine.calls == []


async def test_compaction_summarises_and_its_item_stands_for_the_history(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = (await _post(http, "/v1/responses", input="hi")).json()
    r = await _post(
        http,
        "/v1/responses/compact",
        previous_response_id=first["id"],
        input=[{"role": "user", "content": "and then?"}],
    )
    assert r.status_code == 200, r.text
    body = r.json()
    compacted, kept = strict_compacted(body)
    assert compacted.object == "response.compaction"
    # every user message of the history, then the item that stands for all of it
    assert [o["type"] for o in body["output"]] == ["message", "message", "compaction"]
    assert [(m.role, m.content[0].text, m.status) for m in kept] == [  # type: ignore[union-attr]
        ("user", "hi", "completed"),
        ("user", "and then?", "completed"),
    ]
    assert all(m.id.startswith("msg_") for m in kept)
    assert compacted.usage.output_tokens > 0
    transcript = engine.calls[-1].prompt.request.messages[-1].text
    assert "user: hi" in transcript and "Hello!" in transcript and "and then?" in transcript
    # the compacted history goes on as input
    output = body["output"]
    r = await _post(http, "/v1/responses", input=[*output, {"role": "user", "content": "next"}])
    assert r.status_code == 200, r.text
    summary = [
        m.text
        for m in engine.calls[-1].prompt.request.messages
        if m.text.startswith(SUMMARY_HEADER)
    ]
    assert summary == [f"{SUMMARY_HEADER}\nThe user said hi; the assistant greeted."]
    # altered, it is refused
    output[-1]["encrypted_content"] = output[-1]["encrypted_content"][:-3] + "xyz"
    r = await _post(http, "/v1/responses", input=output)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encrypted_content"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "hi"}, 400, "model"),
        ({"model": FAKE_MODEL, "input": [{"type": "bogus"}]}, 400, "input[0].type"),
        ({"model": FAKE_MODEL, "input": "hi", "previous_response_id": "resp_x"}, 404, None),
        ({"model": "no-such-model", "input": "hi"}, 404, "model"),
    ],
)
async def test_compaction_errors(
    http: httpx.AsyncClient, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = await http.post("/v1/responses/compact", content=json.dumps(body))
    assert r.status_code == status, r.text
    if param is not None:
        assert r.json()["error"]["param"] == param


async def test_a_compaction_trigger_makes_a_response_of_one_compaction_item(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """Codex's way: the history, then `compaction_trigger`, on /v1/responses; the stream
    holds exactly one output item, the compaction, and ends `completed`."""
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"type": "compaction_trigger"},
    ]
    r = await _post(http, "/v1/responses", input=history, stream=True, store=False)
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["compaction"]
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",  # once the summary's first text is sampled
        "response.output_item.done",
        "response.completed",
    ]
    (compacting,) = [e for e in events if e["type"] == "response.compaction.compacting"]
    assert (compacting["item_id"], compacting["output_index"]) == (done[0]["id"], 0)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = strict_response(events[-1]["response"])
    assert [o.type for o in final.output] == ["compaction"] and final.usage is not None
    assert final.usage.output_tokens > 0
    transcript = engine.calls[-1].prompt.request.messages[-1].text
    assert "user: hi" in transcript and "Hello!" in transcript
    # Codex keeps its user messages and the item; the item opens into the summary
    item = done[0]
    r = await _post(
        http, "/v1/responses", input=[{"role": "user", "content": "hi"}, item], store=False
    )
    assert r.status_code == 200, r.text
    prompt = engine.calls[-1].prompt.request.messages
    assert prompt[-1].text == f"{SUMMARY_HEADER}\nThe user said hi; the assistant greeted."


async def test_a_stored_compaction_turn_is_retrieved_and_continued(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = (await _post(http, "/v1/responses", input="hi")).json()
    r = await _post(
        http,
        "/v1/responses",
        previous_response_id=first["id"],
        input=[{"type": "compaction_trigger"}],
    )
    assert r.status_code == 200, r.text
    compacted = strict_response(r.json())
    assert compacted.status == "completed" and [o.type for o in compacted.output] == ["compaction"]
    got = strict_response((await http.get(f"/v1/responses/{compacted.id}")).json())
    assert got.output[0].id == compacted.output[0].id
    r = await _post(http, "/v1/responses", previous_response_id=compacted.id, input="next")
    assert r.status_code == 200, r.text
    contents = [m.text for m in engine.calls[-1].prompt.request.messages]
    assert any(c.startswith(SUMMARY_HEADER) for c in contents) and contents[-1] == "next"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]}, "input[0]"),
        ({"input": ["x", {"type": "compaction_trigger"}]}, "input"),
        (
            {
                "input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}],
                "background": True,
            },
            "background",
        ),
        ({"input": [{"type": "compaction_trigger"}]}, "input"),
    ],
)
async def test_compaction_turn_errors_run_nothing_and_store_nothing(
    http: httpx.AsyncClient, engine: FakeEngine, body: dict[str, Any], param: str
) -> None:
    r = await _post(http, "/v1/responses", stream=True, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert engine.calls == []


async def test_context_management_compacts_a_prompt_past_its_threshold(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "and now?"},
    ]
    r = await _post(http, "/v1/responses", input=history, stream=True, store=False, **COMPACT)
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    final = strict_response(events[-1]["response"])
    assert final.status == "completed"
    assert [o.type for o in final.output][:1] == ["compaction"] and len(final.output) > 1
    # the summary is made in the stream, as a compaction turn makes it: after the start
    types = [e["type"] for e in events]
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.compaction.compacting",
        "response.output_item.done",
    ]
    assert events[2]["item"]["type"] == events[4]["item"]["type"] == "compaction"
    assert types.count("response.created") == 1
    prompt = engine.calls[-1].prompt.request.messages
    assert [m.text for m in prompt if m.role == "user"] == [
        f"{SUMMARY_HEADER}\nThe user said hi; the assistant greeted.",
        "and now?",
    ]
    # under the threshold nothing is compacted
    default = [{"type": "compaction"}]  # 80% of the context window
    r = await _post(http, "/v1/responses", input=history, context_management=default)
    assert "compaction" not in [o["type"] for o in r.json()["output"]]


COMPACT = {"context_management": [{"type": "compaction", "compact_threshold": 5}]}


@pytest.mark.parametrize(
    ("management", "param"),
    [
        ([{"type": "truncate"}], "context_management[0].type"),
        (
            [{"type": "compaction", "compact_threshold": 0}],
            "context_management[0].compact_threshold",
        ),
        ({"type": "compaction"}, "context_management"),
    ],
)
async def test_context_management_errors(
    http: httpx.AsyncClient, engine: FakeEngine, management: Any, param: str
) -> None:
    r = await _post(http, "/v1/responses", input="hi", context_management=management)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert engine.calls == []


async def test_reasoning_summary_parts_and_their_events(http: httpx.AsyncClient) -> None:
    r = await _post(
        http, "/v1/responses", input="hi", stream=True, reasoning={"summary": "detailed"}
    )
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    types = [e["type"] for e in events]
    summary_types = [
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    at = [types.index(t) for t in summary_types]
    assert at == sorted(at) and at[-1] < types.index("response.output_item.done")
    final = strict_response(events[-1]["response"])
    item = final.output[0]
    assert item.type == "reasoning" and [s.text for s in item.summary] == [THOUGHT]
    plain = strict_response((await _post(http, "/v1/responses", input="hi")).json())
    assert plain.output[0].type == "reasoning" and plain.output[0].summary == []


def test_a_concise_summary_keeps_the_opening_sentences() -> None:
    text = "First I look at the question. " + "Then I think more. " * 40
    concise = summarize_reasoning(text, "concise")
    assert concise.startswith("First I look at the question.") and len(concise) <= 281
    assert summarize_reasoning(text, "detailed") == text.strip()
    assert summarize_reasoning("Short.", "concise") == "Short."


async def test_a_summary_that_fails_in_the_stream_fails_the_response() -> None:
    def respond(prompt: Prompt, params: SamplingParams) -> Reply:
        if prompt.request.messages[0].text.startswith("You compact"):
            return Reply(["The user"], finish="error", error="the engine broke")
        return Reply(["Hello!"])

    engine = FakeEngine(respond=respond, model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore())
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "and now?"},
    ]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as http:
        r = await _post(http, "/v1/responses", input=history, stream=True, **COMPACT)
        assert r.status_code == 200, r.text
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: ")]
        for event in events:
            strict_event(event)
        final = strict_response(events[-1]["response"])
        assert events[-1]["type"] == "response.failed" and final.error is not None
        assert final.output == []  # the compaction item was taken back
        # stored as it ended, failed, and never answered from a half-made prompt
        stored = (await http.get(f"/v1/responses/{final.id}")).json()
        assert stored["status"] == "failed"
    assert len(engine.calls) == 1  # the summary only: no answer from a half-made prompt
