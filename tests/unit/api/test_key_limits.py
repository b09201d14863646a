"""Per-key limits over every transport, on the fake engine: one concurrency budget shared by
streams, WebSocket responses and background jobs; rates that count WebSocket creates and
background posts; the background cap; the storage quota; WebSocket connection caps; and
the engine's queue shared fairly between keys."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.fake import FakeEngine, Reply
from respd.service.generation.admission import AdmissionGate
from respd.service.quotas import QuotaSettings
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL
from tests.support.sdk_types import strict_response

pytestmark = pytest.mark.waits  # deadlines and delays, run first (see conftest)

BODY = {"model": FAKE_MODEL, "input": "hi"}
A, B = {"x-api-key": "sk-a"}, {"x-api-key": "sk-b"}
KEYS = ["sk-a", "sk-b"]


def slow_engine(delay: float = 0.02, tokens: int = 20) -> FakeEngine:
    return FakeEngine(respond=lambda *_: Reply(["a"] * tokens, delay=delay), model_id=FAKE_MODEL)


def refused(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return dict(error)


@pytest.fixture()
async def http_of() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(engine: FakeEngine, **kw: Any) -> httpx.AsyncClient:
        app = create_app(engine, MemoryStore(), keys=KeyRing(KEYS), **kw)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        client.app = app  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def wait_done(http: httpx.AsyncClient, rid: str, headers: dict[str, str]) -> dict[str, Any]:
    for _ in range(500):
        body: dict[str, Any] = (await http.get(f"/v1/responses/{rid}", headers=headers)).json()
        if body["status"] in ("completed", "failed", "cancelled", "incomplete"):
            return body
        await asyncio.sleep(0.01)
    raise AssertionError(f"{rid} did not finish")


async def test_background_jobs_share_the_stream_budget(http_of: Any) -> None:
    http = http_of(slow_engine(), quotas=QuotaSettings(streams_per_key=2))
    posts = [
        await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
        for _ in range(3)
    ]
    assert [p.status_code for p in posts[:2]] == [200, 200]
    refused(posts[2], 429, "rate_limit_exceeded")
    stream = await http.post("/v1/responses", json=BODY | {"stream": True}, headers=A)
    refused(stream, 429, "rate_limit_exceeded")  # the jobs hold both slots
    other = await http.post("/v1/responses", json=BODY | {"stream": True}, headers=B)
    assert other.status_code == 200 and "response.completed" in other.text
    for post in posts[:2]:
        assert (await wait_done(http, post.json()["id"], A))["status"] == "completed"
    assert http.app.state.quotas.open_streams("label:a") == 0  # type: ignore[attr-defined]
    again = await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
    assert again.status_code == 200  # the finished jobs gave their slots back


async def test_background_cap_per_key(http_of: Any) -> None:
    http = http_of(slow_engine(), quotas=QuotaSettings(background_per_key=2))
    posts = [
        await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
        for _ in range(3)
    ]
    assert [p.status_code for p in posts[:2]] == [200, 200]
    error = refused(posts[2], 429, "too_many_background_responses")
    assert "2 background responses" in str(error["message"])
    assert posts[2].headers["retry-after"] == "1"
    ok = await http.post("/v1/responses", json=BODY | {"background": True}, headers=B)
    assert ok.status_code == 200  # another key's cap is its own
    streamed = await http.post("/v1/responses", json=BODY | {"stream": True}, headers=A)
    assert streamed.status_code == 200  # only background jobs count here
    await wait_done(http, posts[0].json()["id"], A)
    await wait_done(http, posts[1].json()["id"], A)
    assert (
        await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
    ).status_code == 200


async def test_rates_count_background_posts(http_of: Any) -> None:
    http = http_of(slow_engine(0.0, 2), quotas=QuotaSettings(requests_per_minute=2))
    for _ in range(2):
        ok = await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
        assert ok.status_code == 200 and "x-ratelimit-remaining-requests" in ok.headers
    over = await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
    refused(over, 429, "rate_limit_exceeded")
    assert over.headers["x-ratelimit-remaining-requests"] == "0"
    assert (await http.post("/v1/responses", json=BODY, headers=B)).status_code == 200


async def test_storage_quota_counts_files_and_responses(http_of: Any) -> None:
    http = http_of(slow_engine(0.0, 2), quotas=QuotaSettings(storage_bytes_per_key=3000))
    upload = {"file": ("a.txt", b"x" * 2000, "text/plain")}
    first = await http.post("/v1/files", files=upload, data={"purpose": "user_data"}, headers=A)
    assert first.status_code == 200
    second = await http.post("/v1/files", files=upload, data={"purpose": "user_data"}, headers=A)
    error = refused(second, 413, "storage_quota_exceeded")
    assert error["type"] == "insufficient_quota" and "3000" in str(error["message"])
    listed = (await http.get("/v1/files", headers=A)).json()["data"]
    assert len(listed) == 1  # nothing stored by the refused upload
    statuses = [(await http.post("/v1/responses", json=BODY, headers=A)).status_code]
    while statuses[-1] == 200 and len(statuses) < 10:
        statuses.append((await http.post("/v1/responses", json=BODY, headers=A)).status_code)
    assert statuses[0] == 200 and statuses[-1] == 429  # stored responses fill it up too
    full = await http.post("/v1/responses", json=BODY, headers=A)
    refused(full, 429, "storage_quota_exceeded")
    unstored = await http.post("/v1/responses", json=BODY | {"store": False}, headers=A)
    assert unstored.status_code == 200
    other = await http.post("/v1/files", files=upload, data={"purpose": "user_data"}, headers=B)
    assert other.status_code == 200  # B's quota is its own
    await http.delete(f"/v1/files/{first.json()['id']}", headers=A)
    assert (await http.post("/v1/responses", json=BODY, headers=A)).status_code == 200


def _ws_app(engine: FakeEngine, quotas: QuotaSettings) -> TestClient:
    return TestClient(create_app(engine, MemoryStore(), keys=KeyRing(KEYS), quotas=quotas))


def _create(ws: Any, **body: Any) -> dict[str, Any]:
    ws.send_json({"type": "response.create", "model": FAKE_MODEL, **body})
    while True:
        event: dict[str, Any] = ws.receive_json()
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


def test_websocket_creates_count_against_the_rate() -> None:
    engine = FakeEngine(respond=lambda *_: Reply(["ok"]), model_id=FAKE_MODEL)
    with _ws_app(engine, QuotaSettings(requests_per_minute=3)) as client:
        assert client.post("/v1/responses", json=BODY, headers=A).status_code == 200
        with client.websocket_connect("/v1/responses", headers=A) as ws:
            assert _create(ws, input="one")["type"] == "response.completed"
            assert _create(ws, input="two")["type"] == "response.completed"
            error = _create(ws, input="three")
            assert error["type"] == "error" and error["status"] == 429
            assert error["error"]["code"] == "rate_limit_exceeded"
            assert _create(ws, input="four")["status"] == 429  # the socket stays open
        over = client.post("/v1/responses", json=BODY, headers=A)
        assert over.status_code == 429  # the socket's creates spent the HTTP minute too
        assert client.post("/v1/responses", json=BODY, headers=B).status_code == 200


def test_websocket_responses_take_the_stream_budget() -> None:
    with _ws_app(slow_engine(0.02, 30), QuotaSettings(streams_per_key=1)) as client:
        with client.websocket_connect("/v1/responses", headers=A) as ws:
            ws.send_json({"type": "response.create", "model": FAKE_MODEL, "input": "x"})
            assert ws.receive_json()["type"] == "response.created"
            busy = client.post("/v1/responses", json=BODY | {"stream": True}, headers=A)
            assert busy.status_code == 429
            while ws.receive_json()["type"] != "response.completed":
                pass
            after = client.post("/v1/responses", json=BODY | {"stream": True}, headers=A)
            assert after.status_code == 200  # the socket's response gave its slot back
        with client.websocket_connect("/v1/responses", headers=A) as ws:
            job = client.post("/v1/responses", json=BODY | {"background": True}, headers=A)
            assert job.status_code == 200
            error = _create(ws, input="y")
            assert error["type"] == "error" and error["status"] == 429


def test_websocket_connection_caps() -> None:
    engine = FakeEngine(respond=lambda *_: Reply(["ok"]), model_id=FAKE_MODEL)
    settings = QuotaSettings(sockets_per_key=2, sockets_total=3)
    with _ws_app(engine, settings) as client:
        with (
            client.websocket_connect("/v1/responses", headers=A),
            client.websocket_connect("/v1/responses", headers=A) as second,
        ):
            with (
                pytest.raises(WebSocketDisconnect) as per_key,
                client.websocket_connect("/v1/responses", headers=A),
            ):
                pass
            assert per_key.value.code == 1008 and "2 WebSocket" in per_key.value.reason
            with client.websocket_connect("/v1/responses", headers=B) as third:
                with (
                    pytest.raises(WebSocketDisconnect) as total,
                    client.websocket_connect("/v1/responses", headers=B),
                ):
                    pass
                assert "server already holds 3" in total.value.reason
                assert _create(third, input="x")["type"] == "response.completed"
            assert _create(second, input="x")["type"] == "response.completed"
        with client.websocket_connect("/v1/responses", headers=A) as ws:  # all closed: free
            assert _create(ws, input="x")["type"] == "response.completed"


async def test_one_key_flooding_background_jobs_leaves_another_served(http_of: Any) -> None:
    """Key A posts 80 background responses into 2 slots and a queue of 8: B's requests
    are still admitted (no 503) and run after at most one of A's per slot."""
    engine = FakeEngine(
        respond=lambda *_: Reply(["a"] * 5, delay=0.01), model_id=FAKE_MODEL, capacity=2
    )
    http = http_of(engine, admission=AdmissionGate(slots=2, queue=8))
    posted = [
        await http.post("/v1/responses", json=BODY | {"background": True}, headers=A)
        for _ in range(80)
    ]
    statuses = [p.status_code for p in posted]
    assert statuses[:10] == [200] * 10 and set(statuses[10:]) == {503}  # A fills its share
    health = (await http.get("/health", headers=A)).json()
    assert 0 < health["engine"]["queued"] <= 8  # the gate's waiting requests show
    answers = await asyncio.gather(
        *(http.post("/v1/responses", json=BODY, headers=B) for _ in range(3))
    )
    assert [a.status_code for a in answers] == [200, 200, 200]
    for answer in answers:
        assert strict_response(answer.json()).status == "completed"
    # Served in turn with A's queue, not behind it: some of A's jobs still wait.
    states = [
        (await http.get(f"/v1/responses/{p.json()['id']}", headers=A)).json() for p in posted[:10]
    ]
    assert any(s["status"] == "queued" for s in states), [s["status"] for s in states]
    finished = [await wait_done(http, p.json()["id"], A) for p in posted[:10]]
    assert {f["status"] for f in finished} == {"completed"}
