"""Concurrent requests and client disconnects against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from respd.engines.llamacpp.slots import common_prefix
from tests.support.servers import MODEL_ID, RespdServer, start_server

pytestmark = pytest.mark.long  # hundreds of requests

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
    # Batched decoding may change floating-point results (a batch of 8 rows takes another
    # matmul path than a batch of 1), so a greedy continuation can drift from its solo run
    # after a while. A mixed-up sequence would instead follow another prompt's answer, so
    # each output must share a long prefix with its own solo answer and a longer one than
    # with any other prompt's.
    for prompt, text, _ in results:
        own = common_prefix(text, solo[prompt])
        assert own >= min(len(solo[prompt]), 12), (prompt, text, solo[prompt])
        for other, other_text in solo.items():
            if other != prompt and other_text != solo[prompt]:
                assert common_prefix(text, other_text) < own, f"{prompt!r} got {other!r}'s text"


def test_stream_disconnect_cancels_generation(server: RespdServer, http: httpx.Client) -> None:
    before = _engine(http)
    _LongStream(server).close()  # the client leaves mid-stream
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
                "messages": [{"role": "user", "content": "Write a very long story."}],
                "max_tokens": 1500,
                "temperature": 0,  # greedy runs this prompt to its full budget
            },
            timeout=1.0,
        )
    stats = _after_cancel(http, before)
    assert stats["generated_tokens"] - before["generated_tokens"] < 1000


class _LongStream:
    """A streaming request that would run for a long time, held open until `close()`."""

    def __init__(self, server: RespdServer) -> None:
        self.client = httpx.Client(timeout=60)  # kept: dropping it would drop the stream
        req = self.client.build_request(
            "POST",
            server.base_url + "/v1/responses",
            json={
                "model": MODEL_ID,
                "input": "Write a very long story.",
                "stream": True,
                "max_output_tokens": 1500,
                "temperature": 0,  # greedy runs this prompt to its full budget
            },
        )
        self.response = self.client.send(req, stream=True)
        assert self.response.status_code == 200
        # Held too: a line iterator dropped mid-way closes the response, i.e. disconnects.
        self.lines = self.response.iter_lines()
        for line in self.lines:
            if "output_text.delta" in line:
                break  # generating now: the slot is taken

    def close(self) -> None:
        self.response.close()
        self.client.close()


def test_full_queue_answers_503_and_cancel_frees_the_slot(tmp_path: Path) -> None:
    srv = start_server(
        tmp_path,
        "--ctx-size",
        "2048",
        "--parallel",
        "1",
        "--max-queue",
        "1",
        "--sse-keepalive-secs",
        "0.3",
    )
    try:
        http = httpx.Client(base_url=srv.base_url, timeout=60)
        running = _LongStream(srv)
        # One request may wait in the queue; it is admitted and waits (streaming).
        waiting = httpx.Client(timeout=60).send(
            http.build_request(
                "POST",
                "/v1/responses",
                json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 4, "stream": True},
            ),
            stream=True,
        )
        assert waiting.status_code == 200
        assert _engine(http)["queued"] == 1
        # The next one finds every slot and the queue full: 503 at once, never a hang.
        for path, body in [
            ("/v1/responses", {"model": MODEL_ID, "input": "hi", "max_output_tokens": 4}),
            ("/v1/responses", {"model": MODEL_ID, "input": "hi", "stream": True}),
            (
                "/v1/chat/completions",
                {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
            ),
        ]:
            r = http.post(path, json=body, timeout=10)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "server_is_overloaded"
        time.sleep(1.0)  # a quiet second in the queue: keep-alive comments flow meanwhile
        # Dropping the long stream frees its slot: the queued request now runs to the end.
        running.close()
        lines = [line for line in waiting.iter_lines() if line]
        events = [line for line in lines if line.startswith("event: ")]
        assert events[-1] in ("event: response.completed", "event: response.incomplete")
        first_item = lines.index("event: response.output_item.added")
        assert ": keep-alive" in lines[:first_item], "no keep-alive while queued"
        assert all(line.startswith(("event: ", "data: ", ": keep-alive")) for line in lines)
        waiting.close()
        stats = _engine(http)
        assert stats["cancelled"] == 1 and stats["running"] == 0 and stats["queued"] == 0
        ok = http.post(
            "/v1/responses", json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 4}
        )
        assert ok.status_code == 200
    finally:
        srv.stop()
    srv.assert_no_5xx(allow_503=True)


def test_no_slot_leaks_after_200_mixed_requests(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--ctx-size", "1024", "--parallel", "4")
    base = srv.base_url
    outcomes: dict[str, int] = {}

    async def one(i: int, ac: httpx.AsyncClient) -> None:
        kind = ("stream", "stream_drop", "plain", "plain_drop", "chat_stream")[i % 5]
        prompt = f"Say a word about the number {i}."
        body: dict[str, Any] = {"model": MODEL_ID, "input": prompt, "max_output_tokens": 8}
        if kind == "stream":
            async with ac.stream(
                "POST", base + "/v1/responses", json={**body, "stream": True}
            ) as r:
                lines = [line async for line in r.aiter_lines() if line.startswith("event:")]
                assert lines[-1] in ("event: response.completed", "event: response.incomplete")
        elif kind == "stream_drop":
            body["max_output_tokens"] = 400
            async with ac.stream(
                "POST", base + "/v1/responses", json={**body, "stream": True}
            ) as r:
                async for line in r.aiter_lines():
                    if "output_text.delta" in line:
                        break
        elif kind == "plain":
            r = await ac.post(base + "/v1/responses", json=body)
            assert r.status_code == 200
        elif kind == "plain_drop":
            body["max_output_tokens"] = 400
            with contextlib.suppress(httpx.TimeoutException):
                await ac.post(base + "/v1/responses", json=body, timeout=0.3)
        else:
            chat = {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8,
                "stream": True,
            }
            async with ac.stream("POST", base + "/v1/chat/completions", json=chat) as r:
                assert [line async for line in r.aiter_lines() if line][-1] == "data: [DONE]"
        outcomes[kind] = outcomes.get(kind, 0) + 1

    async def all_of_them() -> None:
        limits = httpx.Limits(max_connections=12)
        async with httpx.AsyncClient(timeout=120, limits=limits) as ac:
            sem = asyncio.Semaphore(12)

            async def bounded(i: int) -> None:
                async with sem:
                    await one(i, ac)

            await asyncio.gather(*(bounded(i) for i in range(200)))

    try:
        asyncio.run(all_of_them())
        assert sum(outcomes.values()) == 200
        http = httpx.Client(base_url=base, timeout=60)
        deadline = time.monotonic() + 60
        stats = _engine(http)
        while time.monotonic() < deadline and (stats["running"] or stats["queued"]):
            time.sleep(0.2)
            stats = _engine(http)
        assert stats["running"] == 0 and stats["queued"] == 0
        assert stats["completed"] + stats["cancelled"] == 200
        assert stats["cancelled"] >= 40  # the dropped ones really were cancelled
        ok = http.post(
            "/v1/responses", json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 4}
        )
        assert ok.status_code == 200
    finally:
        srv.stop()
    srv.assert_no_5xx()


def test_shared_prefix_is_not_prefilled_again(client: openai.OpenAI) -> None:
    instructions = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer politely and briefly." for i in range(150)
    )
    first = client.responses.create(
        model=MODEL_ID, instructions=instructions, input="Hi", max_output_tokens=2
    )
    second = client.responses.create(
        model=MODEL_ID, instructions=instructions, input="Hello there", max_output_tokens=2
    )
    assert first.usage and second.usage
    shared = first.usage.input_tokens - 10
    assert shared > 1000
    assert second.usage.input_tokens_details.cached_tokens >= 0.9 * shared
    assert second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens
