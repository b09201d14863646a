"""`GET /metrics` on the fake engine: requests by route template, the tokens each API
reported, latency histograms, the engine's slots and the store's sizes; the optional key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.base import EngineStats
from respd.engines.fake import FakeEngine, Reply
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(http: httpx.AsyncClient, **headers: str) -> Samples:
    r = await http.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


async def test_metrics_count_requests_tokens_and_latencies(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    engine.add(Reply(["Hel", "lo"], cached_tokens=3), Reply(["a", "b", "c"]))
    before = await scrape(http)
    assert value(before, "respd_output_tokens_total", api="responses") == 0

    resp = await sdk.responses.create(model=FAKE_MODEL, input="hi")
    assert resp.usage is not None
    await sdk.responses.retrieve(resp.id)
    body = {
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        frames = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    chat_usage = json.loads(frames[-2])["usage"]
    assert (await http.get("/no/such/path")).status_code == 404

    after = await scrape(http)
    requests = "respd_requests_total"
    assert value(after, requests, route="/v1/responses", method="POST", status="200") == 1
    assert (
        value(after, requests, route="/v1/responses/{response_id}", method="GET", status="200") == 1
    )
    assert value(after, requests, route="/v1/chat/completions", method="POST", status="200") == 1
    assert value(after, requests, route="other", method="GET", status="404") == 1
    assert value(after, requests, route="/metrics", method="GET", status="200") == 1

    assert value(after, "respd_input_tokens_total", api="responses") == resp.usage.input_tokens
    assert value(after, "respd_output_tokens_total", api="responses") == 2
    assert resp.usage.output_tokens == 2
    assert value(after, "respd_cached_tokens_total", api="responses") == 3
    assert value(after, "respd_input_tokens_total", api="chat") == chat_usage["prompt_tokens"]
    assert (
        value(after, "respd_output_tokens_total", api="chat")
        == chat_usage["completion_tokens"]
        == 3
    )
    for api in ("responses", "chat"):
        assert value(after, "respd_time_to_first_token_seconds_count", api=api) == 1
        assert value(after, "respd_generation_seconds_count", api=api) == 1
        assert value(after, "respd_generation_seconds_sum", api=api) >= value(
            after, "respd_time_to_first_token_seconds_sum", api=api
        )

    assert value(after, "respd_slots_total", model=FAKE_MODEL) == engine.capacity
    assert ("respd_slots_active", frozenset({("model", FAKE_MODEL)})) in after
    assert ("respd_queue_depth", frozenset({("model", FAKE_MODEL)})) in after
    assert value(after, "respd_store_records", kind="responses") == 1
    assert ("respd_store_records", frozenset({("kind", "files")})) in after


async def test_metrics_gauges_read_the_engine_at_scrape_time(
    engine: FakeEngine, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(running=2, queued=5))
    samples = await scrape(http)
    assert value(samples, "respd_slots_active", model=FAKE_MODEL) == 2
    assert value(samples, "respd_queue_depth", model=FAKE_MODEL) == 5
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(running=1, queued=0))
    samples = await scrape(http)
    assert value(samples, "respd_slots_active", model=FAKE_MODEL) == 1
    assert value(samples, "respd_queue_depth", model=FAKE_MODEL) == 0


async def test_metrics_report_the_kv_tiers(
    engine: FakeEngine, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = EngineStats(
        details={"kv_restored_tokens": 300, "kv_cache_ram_bytes": 4096, "kv_cache_disk_bytes": 512}
    )
    monkeypatch.setattr(engine, "stats", lambda: stats)
    samples = await scrape(http)
    assert value(samples, "respd_kv_restored_tokens_total", model=FAKE_MODEL) == 300
    assert value(samples, "respd_kv_cache_bytes", model=FAKE_MODEL, tier="ram") == 4096
    assert value(samples, "respd_kv_cache_bytes", model=FAKE_MODEL, tier="disk") == 512


async def test_metrics_report_speculation(
    engine: FakeEngine, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = EngineStats(details={"draft_tokens": 40, "draft_accepted": 31})
    monkeypatch.setattr(engine, "stats", lambda: stats)
    samples = await scrape(http)
    assert value(samples, "respd_draft_tokens_total", model=FAKE_MODEL) == 40
    assert value(samples, "respd_draft_accepted_tokens_total", model=FAKE_MODEL) == 31


async def test_metrics_report_image_work(
    engine: FakeEngine, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = EngineStats(details={"images_tokenized": 3, "image_chunks_encoded": 5})
    monkeypatch.setattr(engine, "stats", lambda: stats)
    samples = await scrape(http)
    assert value(samples, "respd_images_tokenized_total", model=FAKE_MODEL) == 3
    assert value(samples, "respd_image_chunks_encoded_total", model=FAKE_MODEL) == 5
    health = (await http.get("/health")).json()
    assert health["engine"]["images_tokenized"] == 3
    assert health["engine"]["image_chunks_encoded"] == 5


async def test_an_engine_reports_its_own_counters_and_the_known_ones_default_to_zero(
    engine: FakeEngine, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = EngineStats(completed=2, details={"prefill_batches": 7})
    monkeypatch.setattr(engine, "stats", lambda: stats)
    samples = await scrape(http)
    assert value(samples, "respd_engine_prefill_batches", model=FAKE_MODEL) == 7
    assert value(samples, "respd_draft_tokens_total", model=FAKE_MODEL) == 0
    health = (await http.get("/health")).json()
    assert health["engine"]["prefill_batches"] == 7 and health["engine"]["completed"] == 2
    assert health["engine"]["kv_cache_ram_bytes"] == 0 and "details" not in health["engine"]


async def test_metrics_report_the_media_cache(http: httpx.AsyncClient) -> None:
    samples = await scrape(http)
    for name in ("respd_media_cache_hits_total", "respd_media_cache_misses_total"):
        assert (name, frozenset()) in samples and value(samples, name) == 0
    assert value(samples, "respd_media_cache_bytes") == 0
    assert value(samples, "respd_media_cache_entries") == 0


@pytest.fixture()
async def keyed(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, MemoryStore(), metrics_api_key="metrics-secret")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        yield client


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "no"}])
async def test_metrics_key_refuses_others(
    keyed: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await keyed.get("/metrics", headers=headers)
    assert r.status_code == 401
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key"
    assert "x-request-id" in r.headers


async def test_metrics_key_accepted_as_bearer_or_header(keyed: httpx.AsyncClient) -> None:
    assert await scrape(keyed, authorization="Bearer metrics-secret")
    assert await scrape(keyed, **{"x-api-key": "metrics-secret"})


async def test_metrics_registries_are_per_app(engine: FakeEngine) -> None:
    """Two apps in one process count apart (and building the second does not fail on
    names the first registered)."""
    apps = [create_app(engine, MemoryStore()) for _ in range(2)]
    transport = httpx.ASGITransport(app=apps[0])
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as c:
        await c.get("/v1/models")
    for app, expected in zip(apps, (1, 0), strict=True):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as c:
            samples = await scrape(c)
        route = {"route": "/v1/models", "method": "GET", "status": "200"}
        assert value(samples, "respd_requests_total", **route) == expected


async def test_metrics_count_requests_refused_before_routing(engine: FakeEngine) -> None:
    """A request the key check refuses never reaches the router; it is still counted
    under its route's template."""
    app = create_app(engine, MemoryStore(), keys=KeyRing(["sk-right"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as c:
        r = await c.get("/v1/responses/resp_123")
        assert r.status_code == 401
        samples = await scrape(c)  # /metrics is not behind the API keys
    route = {"route": "/v1/responses/{response_id}", "method": "GET", "status": "401"}
    assert value(samples, "respd_requests_total", **route) == 1
