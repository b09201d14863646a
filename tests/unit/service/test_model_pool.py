"""Local models loaded on first use, through the app, with fake engines as the models:
one load shared by concurrent first requests, the least recently used unloaded at the
limits, pinned models kept, idle ones unloaded after their time to live, a failed load a
503 naming the model while the others serve, and the operators' load/unload routes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.base import Engine
from respd.engines.fake import FakeEngine, Reply
from respd.service.models import LocalModel, ModelRegistry, PoolLimits
from respd.store import MemoryStore
from tests.support.sdk_types import EVENT_ADAPTER


class Loads:
    """Fake models that count their loads (each load takes `seconds`)."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.count: dict[str, int] = {}
        self.engines: dict[str, list[FakeEngine]] = {}
        self.lock = threading.Lock()

    def model(self, model_id: str, **more: Any) -> LocalModel:
        def load() -> Engine:
            time.sleep(self.seconds)
            with self.lock:
                self.count[model_id] = self.count.get(model_id, 0) + 1
            engine = FakeEngine(respond=lambda *_: Reply([f"from {model_id}"]), model_id=model_id)
            self.engines.setdefault(model_id, []).append(engine)
            return engine

        return LocalModel(model_id, load, memory_bytes=100, context_window=4096, **more)


def _broken() -> Engine:
    raise ValueError("failed to load model from file bad.gguf")


def _app(models: list[LocalModel], limits: PoolLimits | None = None, **app: Any) -> Any:
    registry = ModelRegistry(local=models, limits=limits)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(registry, MemoryStore(), **app)),
        base_url="http://t",
    )
    return client, registry


async def _ask(http: httpx.AsyncClient, model: str) -> httpx.Response:
    return await http.post("/v1/responses", json={"model": model, "input": "hi"})


async def _listed(http: httpx.AsyncClient) -> dict[str, bool]:
    cards = (await http.get("/v1/models")).json()["data"]
    return {c["id"]: c["loaded"] for c in cards}


@pytest.fixture(autouse=True)
def _no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("respd.service.models.IN_USE_GRACE_SECS", 0.0)
    monkeypatch.setattr("respd.service.models.HOUSEKEEPING_SECS", 0.05)


async def test_models_load_on_first_use_and_are_listed_either_way() -> None:
    loads = Loads()
    http, _ = _app([loads.model("a"), loads.model("b", vision=True)])
    async with http:
        assert await _listed(http) == {"a": False, "b": False}
        health = await http.get("/health")  # healthy with nothing loaded yet
        assert health.status_code == 200 and health.json()["engines"] == {}
        r = await _ask(http, "a")
        assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "from a"
        assert await _listed(http) == {"a": True, "b": False}
        card = (await http.get("/v1/models/b")).json()
        assert card["loaded"] is False and card["input_modalities"] == ["text", "image"]
        assert card["context_window"] == 4096
        await _ask(http, "a")
    assert loads.count == {"a": 1}


async def test_concurrent_first_requests_share_one_load() -> None:
    loads = Loads(seconds=0.3)
    http, _ = _app([loads.model("a")])
    async with http:
        answers = await asyncio.gather(*(_ask(http, "a") for _ in range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    assert loads.count == {"a": 1}


async def test_the_least_recently_used_is_unloaded_at_the_limit_and_pins_stay() -> None:
    loads = Loads()
    models = [loads.model("pinned", pin=True), loads.model("a"), loads.model("b")]
    http, registry = _app(models, PoolLimits(max_loaded=2))
    registry.preload("pinned")
    async with http:
        await _ask(http, "a")
        assert await _listed(http) == {"pinned": True, "a": True, "b": False}
        await _ask(http, "b")  # a is the least recently used unpinned one
        assert await _listed(http) == {"pinned": True, "a": False, "b": True}
        await _ask(http, "pinned")
        await _ask(http, "a")
        assert await _listed(http) == {"pinned": True, "a": True, "b": False}
    assert loads.count == {"pinned": 1, "a": 2, "b": 1}
    assert loads.engines["a"][0].closed


async def test_memory_limits_unload_to_make_room() -> None:
    loads = Loads()
    http, _ = _app([loads.model("a"), loads.model("b")], PoolLimits(memory_bytes=150))
    async with http:
        await _ask(http, "a")
        await _ask(http, "b")
        assert await _listed(http) == {"a": False, "b": True}


async def test_a_busy_model_is_not_unloaded_and_the_load_waits_for_room() -> None:
    loads = Loads()
    slow = LocalModel(
        "slow",
        lambda: FakeEngine([Reply(["x"] * 20, delay=0.05)], model_id="slow"),
        memory_bytes=1,
    )
    http, _ = _app([slow, loads.model("b")], PoolLimits(max_loaded=1))
    async with http:
        first = asyncio.ensure_future(_ask(http, "slow"))
        await asyncio.sleep(0.3)  # slow is generating
        second = await _ask(http, "b")  # waits until slow is done, then replaces it
        assert (await first).status_code == 200
        assert second.status_code == 200
        assert await _listed(http) == {"slow": False, "b": True}


async def test_an_idle_model_is_unloaded_after_its_ttl() -> None:
    loads = Loads()
    http, _ = _app([loads.model("a", ttl=0.2), loads.model("b")], PoolLimits(idle_secs=0))
    async with http:
        await _ask(http, "a")
        await _ask(http, "b")
        await asyncio.sleep(0.6)
        assert await _listed(http) == {"a": False, "b": True}  # b has no ttl: it stays


async def test_a_model_that_fails_to_load_is_a_503_naming_it_and_the_others_serve() -> None:
    loads = Loads()
    bad = LocalModel("bad", _broken, memory_bytes=1)
    http, _ = _app([bad, loads.model("good")])
    async with http:
        r = await _ask(http, "bad")
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "model_load_failed" and "bad" in error["message"]
        assert "bad.gguf" in error["message"]
        assert (await _ask(http, "good")).status_code == 200
        card = (await http.get("/v1/models/bad")).json()
        assert card["loaded"] is False and "bad.gguf" in card["load_error"]
        assert (await http.get("/health")).status_code == 200


async def test_operators_load_and_unload_models() -> None:
    loads = Loads()
    http, _ = _app([loads.model("a")], metrics_api_key="ops", keys=KeyRing(["user"]))
    ops = {"authorization": "Bearer ops"}
    async with http:
        denied = await http.post("/v1/models/a/load", headers={"authorization": "Bearer user"})
        assert denied.status_code == 401
        loaded = await http.post("/v1/models/a/load", headers=ops)
        assert loaded.status_code == 200 and loaded.json()["loaded"] is True
        assert loads.count == {"a": 1}
        gone = await http.post("/v1/models/a/unload", headers=ops)
        assert gone.json() == {"id": "a", "object": "model", "unloaded": True}
        again = await http.post("/v1/models/a/unload", headers=ops)
        assert again.json()["unloaded"] is False
        missing = await http.post("/v1/models/nope/load", headers=ops)
        assert missing.status_code == 404


async def test_chat_and_compaction_load_the_model_too() -> None:
    loads = Loads()
    http, _ = _app([loads.model("a")])
    async with http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": "a", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from a"


def test_registry_refuses_an_id_served_twice() -> None:
    loads = Loads()
    with pytest.raises(ValueError, match="share the id"):
        ModelRegistry([FakeEngine(model_id="a")], local=[loads.model("a")])


HELLO = [{"role": "user", "content": "hi"}]


async def _raw_stream(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    async with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return "".join([chunk async for chunk in r.aiter_text()])


async def test_a_stream_keeps_alive_while_its_model_loads() -> None:
    loads = Loads(seconds=0.6)
    http, _ = _app([loads.model("a"), loads.model("b")], sse_keepalive=0.1)
    async with http:
        text = await _raw_stream(http, "/v1/responses", {"model": "a", "input": "hi"})
        assert text.index(": keep-alive") < text.index("response.created")
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        for event in events:
            EVENT_ADAPTER.validate_python(event)
        assert events[-1]["type"] == "response.completed"
        chat = await _raw_stream(
            http,
            "/v1/chat/completions",
            {"model": "b", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.index(": keep-alive") < chat.index("chat.completion.chunk")
        assert chat.rstrip().endswith("data: [DONE]") and "from b" in chat


async def test_a_stream_whose_model_fails_to_load_ends_with_its_error() -> None:
    http, _ = _app([LocalModel("bad", _broken)])
    async with http:
        text = await _raw_stream(http, "/v1/responses", {"model": "bad", "input": "hi"})
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert len(events) == 1
        EVENT_ADAPTER.validate_python(events[0])
        assert events[0]["type"] == "error" and events[0]["code"] == "model_load_failed"
        chat = await _raw_stream(
            http,
            "/v1/chat/completions",
            {"model": "bad", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert '"model_load_failed"' in chat and chat.rstrip().endswith("data: [DONE]")
