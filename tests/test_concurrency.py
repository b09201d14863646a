"""Concurrent requests and client disconnects against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import openai

from tests.conftest import MODEL_ID, RespdServer

PROMPTS = [
    "What is 2+2?",
    "Name a fruit.",
    "Say hello.",
    "What color is the sky?",
    "Name an animal.",
    "What is the capital of Italy?",
    "Give me a number.",
    "Say goodbye.",
    "Name a planet.",
    "What is water made of?",
]


def _engine(http: httpx.Client) -> dict[str, Any]:
    return http.get("/health").json()["engine"]  # type: ignore[no-any-return]


def _after_cancel(http: httpx.Client, before: dict[str, Any]) -> dict[str, Any]:
    """Engine counters once the one cancelled generation has wound down (bounded wait)."""
    deadline = time.monotonic() + 30
    stats = _engine(http)
    while time.monotonic() < deadline:
        if stats["cancelled"] > before["cancelled"] and stats["running"] == 0:
            break
        time.sleep(0.1)
        stats = _engine(http)
    assert stats["cancelled"] == before["cancelled"] + 1
    return stats


def test_ten_concurrent_streams_complete_with_their_own_outputs(
    server: RespdServer, client: openai.OpenAI
) -> None:
    solo = {
        p: client.responses.create(
            model=MODEL_ID, input=p, max_output_tokens=24, temperature=0
        ).output_text
        for p in PROMPTS
    }
    assert len(set(solo.values())) > 5, "prompts should produce distinct answers"

    async def one(aclient: openai.AsyncOpenAI, prompt: str) -> tuple[str, str, str]:
        events = []
        async with aclient.responses.stream(
            model=MODEL_ID, input=prompt, max_output_tokens=24, temperature=0
        ) as stream:
            async for event in stream:
                events.append(event)
        terminal = events[-1]
        assert terminal.type in ("response.completed", "response.incomplete")
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == terminal.response.output_text
        return prompt, deltas, terminal.response.id

    async def all_of_them() -> list[tuple[str, str, str]]:
        aclient = server.async_client()
        try:
            return await asyncio.gather(*(one(aclient, p) for p in PROMPTS))
        finally:
            await aclient.close()

    results = asyncio.run(all_of_them())
    assert len(results) == len(PROMPTS)
    assert len({rid for _, _, rid in results}) == len(PROMPTS)
    for prompt, text, _ in results:
        assert text == solo[prompt], f"output for {prompt!r} was mixed up"


def test_stream_disconnect_cancels_generation(server: RespdServer, http: httpx.Client) -> None:
    before = _engine(http)
    with httpx.stream(
        "POST",
        server.base_url + "/v1/responses",
        json={
            "model": MODEL_ID,
            "input": "Write a very long story.",
            "stream": True,
            "max_output_tokens": 1500,
            "temperature": 1.0,
        },
        timeout=60,
    ) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data:") and "output_text.delta" in line:
                seen += 1
                if seen >= 3:
                    break  # leaving the block closes the connection mid-stream
    stats = _after_cancel(http, before)
    assert stats["running"] == 0
    # The cancelled generation stopped far short of its 1,500-token budget.
    assert stats["generated_tokens"] - before["generated_tokens"] < 1000
    # And the server is healthy: the next request is served normally.
    ok = http.post("/v1/responses", json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 4})
    assert ok.status_code == 200


def test_nonstream_disconnect_cancels_generation(server: RespdServer, http: httpx.Client) -> None:
    before = _engine(http)
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(
            server.base_url + "/v1/chat/completions",
            json={
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "Write a long essay."}],
                "max_tokens": 1500,
                "temperature": 1.0,
            },
            timeout=1.0,
        )
    stats = _after_cancel(http, before)
    assert stats["generated_tokens"] - before["generated_tokens"] < 1000
