"""A soak: 32 concurrent clients for 60 seconds against one real `respd serve`, mixing
streaming and non-streaming Responses and Chat requests, streams dropped mid-way,
background jobs cancelled, and bad requests. Afterwards: no 5xx and no traceback, no slot
left running or queued, resident memory grown by less than RSS_GROWTH_BOUND, every
response acknowledged with a 200 still stored as it was answered, and `/metrics` scraped
during the run shows the request and token counters moving. It prints its figures."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import MODEL_ID, RespdServer, start_server

pytestmark = pytest.mark.long  # a fixed minute of load

CLIENTS = 32
SOAK_SECS = 60.0
RSS_GROWTH_BOUND = 256 * 2**20
PROMPTS = ["Say hi.", "Name a color.", "Count to 3.", "What is 2+2?", "Name a fruit."]


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    data = tmp_path_factory.mktemp("soak-data")
    srv = start_server(
        tmp_path_factory.mktemp("soak"),
        "--ctx-size", "1024",
        "--parallel", "4",
        "--store", "sqlite",
        "--data-dir", str(data),
    )  # fmt: skip
    yield srv
    srv.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def scrape(base_url: str) -> dict[str, float]:
    """Sum of each counter family over its labels."""
    text = httpx.get(base_url + "/metrics", timeout=30).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


class Soak:
    def __init__(self, base_url: str, seed: int) -> None:
        self.base_url = base_url
        self.rng = random.Random(seed)
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.acknowledged: dict[str, str] = {}  # response id -> output text answered
        self.problems: list[str] = []

    def body(self, **extra: Any) -> dict[str, Any]:
        return {
            "model": MODEL_ID,
            "input": self.rng.choice(PROMPTS),
            "max_output_tokens": self.rng.randint(4, 24),
            **extra,
        }

    async def client(self, http: httpx.AsyncClient, deadline: float) -> None:
        actions = [
            self.plain,
            self.stream,
            self.dropped_stream,
            self.background_cancel,
            self.chat,
            self.chat_stream,
            self.bad,
        ]
        while time.monotonic() < deadline:
            action = self.rng.choice(actions)
            self.kinds[action.__name__] += 1
            try:
                await action(http)
            except (httpx.HTTPError, AssertionError, KeyError, ValueError) as exc:
                self.problems.append(f"{action.__name__}: {type(exc).__name__}: {exc}")

    def _status(self, r: httpx.Response) -> None:
        self.statuses[r.status_code] += 1

    async def plain(self, http: httpx.AsyncClient) -> None:
        r = await http.post("/v1/responses", json=self.body())
        self._status(r)
        assert r.status_code == 200, r.text
        data = r.json()
        self.acknowledged[data["id"]] = data["output"][0]["content"][0]["text"]

    async def stream(self, http: httpx.AsyncClient) -> None:
        async with http.stream("POST", "/v1/responses", json=self.body(stream=True)) as r:
            self._status(r)
            assert r.status_code == 200
            last = ""
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    last = line
        assert '"response.completed"' in last or '"response.incomplete"' in last, last[:200]

    async def dropped_stream(self, http: httpx.AsyncClient) -> None:
        async with http.stream("POST", "/v1/responses", json=self.body(stream=True)) as r:
            self._status(r)
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    break  # hang up mid-stream

    async def background_cancel(self, http: httpx.AsyncClient) -> None:
        r = await http.post("/v1/responses", json=self.body(background=True))
        self._status(r)
        assert r.status_code == 200 and r.json()["status"] == "queued"
        c = await http.post(f"/v1/responses/{r.json()['id']}/cancel")
        self._status(c)
        assert c.status_code == 200 and c.json()["status"] in (
            "cancelled",
            "completed",
            "incomplete",
        )

    async def chat(self, http: httpx.AsyncClient) -> None:
        body = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": self.rng.choice(PROMPTS)}],
            "max_tokens": self.rng.randint(4, 24),
        }
        r = await http.post("/v1/chat/completions", json=body)
        self._status(r)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"]

    async def chat_stream(self, http: httpx.AsyncClient) -> None:
        body = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": self.rng.choice(PROMPTS)}],
            "max_tokens": self.rng.randint(4, 24),
            "stream": True,
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            self._status(r)
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"

    async def bad(self, http: httpx.AsyncClient) -> None:
        broken = self.rng.choice(
            [
                {"model": MODEL_ID, "input": [{"type": {}}]},
                {"model": MODEL_ID, "input": "x", "temperature": 9},
                {"model": "no-such-model", "input": "x"},
                {"model": MODEL_ID, "input": "x", "previous_response_id": "resp_nope"},
            ]
        )
        r = await http.post("/v1/responses", json=broken)
        self._status(r)
        assert r.status_code in (400, 404), r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_32_clients_for_60_seconds(soaked: RespdServer) -> None:
    base = soaked.base_url
    warm = httpx.post(base + "/v1/responses", json={"model": MODEL_ID, "input": "hi"}, timeout=60)
    assert warm.status_code == 200
    rss_before = rss_bytes(soaked.process.pid)
    metrics_before = scrape(base)
    soak = Soak(base, seed=7)
    mid: dict[str, float] = {}

    async def run() -> None:
        deadline = time.monotonic() + SOAK_SECS
        limits = httpx.Limits(max_connections=CLIENTS + 4)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as http:

            async def scrape_midway() -> None:
                await asyncio.sleep(SOAK_SECS / 2)
                mid.update(await asyncio.to_thread(scrape, base))

            await asyncio.gather(
                scrape_midway(), *(soak.client(http, deadline) for _ in range(CLIENTS))
            )

    started = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - started

    # No slot leaked: the engine settles to nothing running and nothing queued.
    deadline = time.monotonic() + 30
    while True:
        engine = httpx.get(base + "/health", timeout=10).json()["engine"]
        if engine["running"] == 0 and engine["queued"] == 0:
            break
        assert time.monotonic() < deadline, engine
        time.sleep(0.2)
    rss_after = rss_bytes(soaked.process.pid)
    requests = sum(soak.statuses.values())
    print(
        f"\nsoak: {requests} requests from {CLIENTS} clients in {elapsed:.0f}s "
        f"({requests / elapsed:.1f}/s); kinds {dict(soak.kinds)}; statuses "
        f"{dict(sorted(soak.statuses.items()))}; RSS {rss_before / 2**20:.0f} -> "
        f"{rss_after / 2**20:.0f} MiB; problems {len(soak.problems)}"
    )
    assert not soak.problems, soak.problems[:10]
    assert elapsed >= SOAK_SECS
    assert not [s for s in soak.statuses if s >= 500], soak.statuses
    assert rss_after - rss_before < RSS_GROWTH_BOUND
    # Every acknowledged response is stored as it was answered.
    assert len(soak.acknowledged) > 20
    with httpx.Client(base_url=base, timeout=30) as http:
        for response_id, text in soak.acknowledged.items():
            stored = http.get(f"/v1/responses/{response_id}").json()
            assert stored["output"][0]["content"][0]["text"] == text, response_id
    # The counters moved during the run.
    after = scrape(base)
    for name in ("respd_requests_total", "respd_output_tokens_total"):
        assert metrics_before[name] < mid[name] < after[name], name
    soaked.stop()
    soaked.assert_no_5xx()
