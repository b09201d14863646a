"""API keys and tenant isolation, on the fake engine: one identical 401 for a missing and a
wrong key, and a cross-tenant matrix in which every owned object, by every access path,
is a 404 to another key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from respd.api.app import create_app
from respd.api.identity import KeyRing, parse_keys_file
from respd.engines.fake import FakeEngine, Reply
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL

KEY_A, KEY_B = "sk-alice-0123456789", "sk-bob-9876543210"


@pytest.fixture()
async def http() -> AsyncIterator[httpx.AsyncClient]:
    engine = FakeEngine(respond=lambda *_: Reply(["Hel", "lo", "."]), model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore(), keys=KeyRing([KEY_A, KEY_B]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_keys_file_lines() -> None:
    text = "# team keys\nsk-1 alice\n\n  sk-2   # no label\nsk-3 ops team\n"
    assert parse_keys_file(text) == [("sk-1", "alice"), ("sk-2", None), ("sk-3", "ops team")]


def test_identities_come_from_labels_or_hashes(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-1 alice\nsk-2 alice\nsk-3\n")
    ring = KeyRing(["sk-flag"], keys)
    one, two, three = (ring.identify(k) for k in ("sk-1", "sk-2", "sk-3"))
    assert one is not None and two is not None and three is not None
    assert one.owner == two.owner == "label:alice"  # a label names one identity
    assert "sk-3" not in three.owner and "sk-3" not in three.label  # never the key itself
    assert ring.identify("sk-flag") is not None
    assert (
        ring.identify("sk-4") is None and ring.identify("") is None and ring.identify(None) is None
    )
    keys.write_text("sk-4 bob\n")
    ring.reload()
    assert ring.identify("sk-1") is None and ring.identify("sk-4") is not None
    keys.unlink()
    ring.reload()  # an unreadable file keeps the keys in force
    assert ring.identify("sk-4") is not None


async def test_missing_and_wrong_keys_get_the_same_401(http: httpx.AsyncClient) -> None:
    body = {"model": FAKE_MODEL, "input": "hi"}
    answers = [
        await http.post("/v1/responses", json=body),
        await http.post("/v1/responses", json=body, headers=bearer("sk-wrong")),
        await http.post("/v1/responses", json=body, headers={"x-api-key": "sk-wrong"}),
        await http.get("/v1/models", headers={"authorization": "Basic " + KEY_A}),
    ]
    assert {r.status_code for r in answers} == {401}
    assert len({r.text for r in answers}) == 1
    error = answers[0].json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert (await http.get("/health")).status_code == 200  # public
    ok = await http.post("/v1/responses", json=body, headers={"x-api-key": KEY_A})
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


async def test_another_key_sees_none_of_it(http: httpx.AsyncClient) -> None:
    a, b = bearer(KEY_A), bearer(KEY_B)

    async def post(path: str, body: object, headers: dict[str, str]) -> httpx.Response:
        return await http.post(path, json=body, headers=headers)

    resp = (await post("/v1/responses", {"model": FAKE_MODEL, "input": "hi"}, a)).json()
    rid = resp["id"]
    background = (
        await post("/v1/responses", {"model": FAKE_MODEL, "input": "hi", "background": True}, a)
    ).json()["id"]
    conv = await post("/v1/conversations", {"items": [{"role": "user", "content": "x"}]}, a)
    conv_id = conv.json()["id"]
    items = (await http.get(f"/v1/conversations/{conv_id}/items", headers=a)).json()["data"]
    item_id = items[0]["id"]
    upload = await http.post(
        "/v1/files",
        files={"file": ("notes.txt", b"secret notes", "text/plain")},
        data={"purpose": "user_data"},
        headers=a,
    )
    file_id = upload.json()["id"]
    for _ in range(100):  # the background job is done before its stream is replayed
        got = (await http.get(f"/v1/responses/{background}", headers=a)).json()
        if got["status"] == "completed":
            break
        await asyncio.sleep(0.01)

    gen = {"model": FAKE_MODEL}
    foreign = [
        http.get(f"/v1/responses/{rid}", headers=b),
        http.get(f"/v1/responses/{background}", headers=b),
        http.get(f"/v1/responses/{background}?stream=true", headers=b),
        http.get(f"/v1/responses/{rid}/input_items", headers=b),
        http.post(f"/v1/responses/{background}/cancel", headers=b),
        http.delete(f"/v1/responses/{rid}", headers=b),
        post("/v1/responses", gen | {"input": "more", "previous_response_id": rid}, b),
        post("/v1/responses", gen | {"input": "more", "conversation": conv_id}, b),
        post(
            "/v1/responses/input_tokens",
            gen | {"input": "more", "previous_response_id": rid},
            b,
        ),
        post(
            "/v1/responses",
            gen
            | {
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": file_id}]}]
            },
            b,
        ),
        http.get(f"/v1/conversations/{conv_id}", headers=b),
        post(f"/v1/conversations/{conv_id}", {"metadata": {"k": "v"}}, b),
        http.get(f"/v1/conversations/{conv_id}/items", headers=b),
        http.get(f"/v1/conversations/{conv_id}/items/{item_id}", headers=b),
        post(
            f"/v1/conversations/{conv_id}/items", {"items": [{"role": "user", "content": "y"}]}, b
        ),
        http.delete(f"/v1/conversations/{conv_id}/items/{item_id}", headers=b),
        http.delete(f"/v1/conversations/{conv_id}", headers=b),
        http.get(f"/v1/files/{file_id}", headers=b),
        http.get(f"/v1/files/{file_id}/content", headers=b),
        http.delete(f"/v1/files/{file_id}", headers=b),
    ]
    for attempt in foreign:
        r = await attempt
        assert r.status_code == 404, (r.request.method, r.request.url, r.status_code, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
        for secret in ("Hello", "secret notes"):
            assert secret not in r.text
    listed = (await http.get("/v1/files", headers=b)).json()["data"]
    assert listed == []

    # Everything is still there, unchanged, for its owner.
    assert (await http.get(f"/v1/responses/{rid}", headers=a)).json()["output"] == resp["output"]
    assert (await http.get(f"/v1/conversations/{conv_id}/items", headers=a)).json()["data"] == items
    assert (await http.get(f"/v1/conversations/{conv_id}", headers=a)).json()["metadata"] == {}
    content = await http.get(f"/v1/files/{file_id}/content", headers=a)
    assert content.content == b"secret notes"
    assert [f["id"] for f in (await http.get("/v1/files", headers=a)).json()["data"]] == [file_id]
    chained = await post("/v1/responses", gen | {"input": "more", "previous_response_id": rid}, a)
    assert chained.status_code == 200, chained.text
    replay = await http.get(f"/v1/responses/{background}?stream=true", headers=a)
    events = [json.loads(line[6:]) for line in replay.text.splitlines() if line.startswith("data:")]
    assert events[-1]["type"] == "response.completed"
