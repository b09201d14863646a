"""`--max-input-chars` counts every character the model will read, wherever it sits: text
under a tool output part of an unknown type (kept as JSON in the prompt), object keys,
tool descriptions and schemas. 30 M characters in any of them are refused within a second,
before anything is tokenized."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from respd.engines.fake import FakeEngine
from tests.support.fake import FAKE_MODEL

BIG = 30_000_000
HI = {"model": FAKE_MODEL, "input": "hi"}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def _output(part: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": FAKE_MODEL,
        "input": [CALL, {"type": "function_call_output", "call_id": "c1", "output": [part]}],
    }


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    x = "x" * BIG
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    return [
        ("responses", "unknown-part-data", _output({"type": "mystery", "data": x})),
        ("responses", "unknown-part-url", _output({"type": "mystery", "url": x})),
        ("responses", "unknown-part-key", _output({"type": "mystery", x: 1})),
        ("responses", "text-part", _output({"type": "input_text", "text": x})),
        ("responses", "message", {"model": FAKE_MODEL, "input": x}),
        ("responses", "tool-description", {**HI, "tools": [tool | {"description": x}]}),
        ("chat", "message", {"model": FAKE_MODEL, "messages": [{"role": "user", "content": x}]}),
        ("chat", "tool-description", {
            "model": FAKE_MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "description": x}}],
        }),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("api", "where", "body"), _cases(), ids=lambda v: v if isinstance(v, str) else ""
)
async def test_thirty_million_characters_anywhere_are_refused_fast(
    http: httpx.AsyncClient, engine: FakeEngine, api: str, where: str, body: dict[str, Any]
) -> None:
    raw = json.dumps(body).encode()
    path = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    started = time.perf_counter()
    r = await http.post(path, content=raw, headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - started
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "string_above_max_length"
    assert elapsed < 1.0, f"{where}: {elapsed:.2f}s"
    assert engine.calls == [] and engine.renders == 0
