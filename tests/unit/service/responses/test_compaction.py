"""Compaction as OpenAI returns it, over the app and the fake engine: `/responses/compact`
keeps the user messages ahead of its item and takes the prompt-cache fields; a compaction
turn reports its progress with `response.compaction.compacting`, paced, and a failed
summary leaves no half-made item behind."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest

from respd.engines.fake import FakeEngine, Reply
from respd.service.responses import summary
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_compacted, strict_event, strict_response

HISTORY = [
    {"role": "user", "content": "My name is Ada."},
    {"role": "assistant", "content": "Hello Ada."},
    {"role": "user", "content": [{"type": "input_text", "text": "I like tea."}]},
]


async def test_compact_takes_the_prompt_cache_fields_and_keeps_user_messages(
    sdk: openai.AsyncOpenAI, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.add("Ada likes tea.", "Go on.")
    with caplog.at_level(logging.INFO):
        compacted = await sdk.responses.with_raw_response.compact(
            model=FAKE_MODEL,
            input=HISTORY,  # type: ignore[arg-type]
            prompt_cache_key="ada-session",
            prompt_cache_retention="24h",
            safety_identifier="user-7",
        )
    body = json.loads(compacted.text)
    parsed, kept = strict_compacted(body)
    assert [m.content[0].text for m in kept] == ["My name is Ada.", "I like tea."]  # type: ignore[union-attr]
    assert [o.type for o in parsed.output] == ["compaction"]
    assert parsed.safety_identifier == "user-7" and parsed.service_tier == "default"
    assert engine.calls[-1].cache_key == "ada-session"  # the summary's KV goes under the key
    assert "unknown field" not in caplog.text
    # what it returns goes back in as the next input, as it is
    r = await sdk.responses.create(
        model=FAKE_MODEL, input=[*body["output"], {"role": "user", "content": "And?"}]
    )
    assert r.status == "completed"


async def test_compact_refuses_a_bad_retention(http: httpx.AsyncClient) -> None:
    r = await http.post(
        "/v1/responses/compact",
        json={"model": FAKE_MODEL, "input": "hi", "prompt_cache_retention": "forever"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_cache_retention"


def _events(text: str) -> list[dict[str, Any]]:
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    return events


async def test_compacting_events_are_paced(
    http: httpx.AsyncClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.add(Reply([f"part{i} " for i in range(6)], delay=0.02))
    body = {
        "model": FAKE_MODEL,
        "input": [*HISTORY, {"type": "compaction_trigger"}],
        "stream": True,
    }
    events = _events((await http.post("/v1/responses", json=body)).text)
    assert [e["type"] for e in events].count("response.compaction.compacting") == 1
    # with a pace shorter than the summary, one per sampled step past it
    monkeypatch.setattr(summary, "COMPACTING_EVERY_SECS", 0.0)
    engine.add(Reply([f"part{i} " for i in range(6)], delay=0.02))
    events = _events((await http.post("/v1/responses", json=body)).text)
    assert [e["type"] for e in events].count("response.compaction.compacting") == 6


async def test_a_failed_summary_leaves_no_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.add(Reply(["half a "], finish="error", error="boom"))
    body = {
        "model": FAKE_MODEL,
        "input": [*HISTORY, {"type": "compaction_trigger"}],
        "stream": True,
    }
    events = _events((await http.post("/v1/responses", json=body)).text)
    assert events[-1]["type"] == "response.failed"
    final = strict_response(events[-1]["response"])
    assert final.output == [] and final.error is not None
    types = [e["type"] for e in events]
    assert "response.output_item.done" not in types
