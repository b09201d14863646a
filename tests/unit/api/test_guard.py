"""The request guard and the limits, on the fake engine: foreign Host, untrusted Origin,
non-JSON bodies, oversized bodies, too many items, characters or tools, per-key rates and
streams. Each gets its status, its headers and OpenAI's error shape, and nothing is
generated or stored."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Callable

import brotli
import httpx
import pytest
import zstandard
from fastapi import FastAPI

from respd.api.app import create_app
from respd.api.guard import GuardSettings, default_allowed_hosts
from respd.api.identity import KeyRing
from respd.api.quotas import KeyQuotas, QuotaSettings, _duration
from respd.engines.fake import FakeEngine, Reply
from respd.service.limits import InputLimits, text_chars
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL

ORIGIN = "https://app.example"
BODY = {"model": FAKE_MODEL, "input": "hi"}


def error_of(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert r.headers["x-request-id"]
    return dict(error)


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine(respond=lambda *_: Reply(["Hi", "."]), model_id=FAKE_MODEL)


@pytest.fixture()
def make_client(
    engine: FakeEngine,
) -> Callable[..., httpx.AsyncClient]:
    def make(host: str = "127.0.0.1:8080", **kw: object) -> httpx.AsyncClient:
        app: FastAPI = create_app(engine, MemoryStore(), **kw)  # type: ignore[arg-type]
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}")

    return make


@pytest.fixture()
async def guarded(
    make_client: Callable[..., httpx.AsyncClient],
) -> AsyncIterator[httpx.AsyncClient]:
    guard = GuardSettings(
        allowed_hosts=default_allowed_hosts("127.0.0.1"),
        cors_origins=[ORIGIN],
        max_request_bytes=4096,
        max_upload_bytes=8192,
    )
    async with make_client(guard=guard) as client:
        yield client


async def test_foreign_host_is_refused(guarded: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await guarded.post("/v1/responses", json=BODY, headers={"host": "attacker.example"})
    error_of(r, 400, "invalid_host")
    for host in ("localhost:8080", "127.0.0.1", "[::1]:9000"):
        ok = await guarded.post("/v1/responses", json=BODY, headers={"host": host})
        assert ok.status_code == 200, (host, ok.text)
    assert len(engine.calls) == 3


async def test_origins(guarded: httpx.AsyncClient, engine: FakeEngine) -> None:
    evil = await guarded.post(
        "/v1/responses", json=BODY, headers={"origin": "https://evil.example"}
    )
    error_of(evil, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in evil.headers
    preflight_evil = await guarded.options(
        "/v1/responses",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert preflight_evil.status_code == 403
    assert "access-control-allow-origin" not in preflight_evil.headers
    assert engine.calls == []

    preflight = await guarded.options(
        "/v1/responses",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    ok = await guarded.post("/v1/responses", json=BODY, headers={"origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in ok.headers["access-control-expose-headers"]
    same = await guarded.post(
        "/v1/responses", json=BODY, headers={"origin": "http://127.0.0.1:8080"}
    )
    assert same.status_code == 200  # a page served by this server itself


async def test_json_routes_refuse_other_content_types(
    guarded: httpx.AsyncClient, engine: FakeEngine
) -> None:
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = await guarded.post(
            "/v1/responses",
            content=b'{"model":"fake-model","input":"hi"}',
            headers={"content-type": kind},
        )
        error_of(r, 415, "unsupported_media_type")
    upload = await guarded.post(
        "/v1/files", content=b"purpose=user_data", headers={"content-type": "text/plain"}
    )
    error_of(upload, 400, "invalid_content_type")  # the upload route's own check
    assert engine.calls == []
    assert (await guarded.get("/v1/files")).json()["data"] == []
    ok = await guarded.post(
        "/v1/responses",
        content=b'{"model":"fake-model","input":"hi"}',
        headers={"content-type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200
    bodiless = await guarded.post("/v1/responses/resp_none/cancel")  # no body, no type: fine
    assert bodiless.status_code == 404


async def test_bodies_over_the_limit_are_413(
    guarded: httpx.AsyncClient, engine: FakeEngine
) -> None:
    big = BODY | {"input": "x" * 5000}
    error_of(await guarded.post("/v1/responses", json=big), 413, "request_too_large")

    async def chunked() -> AsyncIterator[bytes]:  # no content-length to check up front
        yield b'{"model": "fake-model", "input": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = await guarded.post(
        "/v1/responses", content=chunked(), headers={"content-type": "application/json"}
    )
    error_of(r, 413, "request_too_large")
    upload = await guarded.post(
        "/v1/files",
        files={"file": ("big.txt", b"z" * 9000, "text/plain")},
        data={"purpose": "user_data"},
    )
    error_of(upload, 413, "file_too_large")
    small = await guarded.post(
        "/v1/files",
        files={"file": ("small.txt", b"z" * 5000, "text/plain")},
        data={"purpose": "user_data"},
    )
    assert small.status_code == 200, small.text  # uploads have their own, larger bound
    assert engine.calls == []


def test_default_hosts_follow_the_bind_address() -> None:
    assert "localhost" in default_allowed_hosts("127.0.0.1")
    assert "localhost" in default_allowed_hosts("::1")
    assert default_allowed_hosts("0.0.0.0") == ["*"]


# -- what one request may ask for -----------------------------------------------------------


async def test_input_limits_on_both_apis(
    make_client: Callable[..., httpx.AsyncClient], engine: FakeEngine
) -> None:
    limits = InputLimits(max_items=3, max_chars=100, max_tools=1)
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    chat_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    async with make_client(input_limits=limits) as http:
        items = [{"role": "user", "content": "a"}] * 4
        error = error_of(
            await http.post("/v1/responses", json=BODY | {"input": items}),
            400,
            "array_above_max_length",
        )
        assert error["param"] == "input"
        error = error_of(
            await http.post("/v1/chat/completions", json={"model": FAKE_MODEL, "messages": items}),
            400,
            "array_above_max_length",
        )
        assert error["param"] == "messages"
        long = BODY | {"input": "x" * 60, "instructions": "y" * 41}
        error_of(await http.post("/v1/responses", json=long), 400, "string_above_max_length")
        error = error_of(
            await http.post("/v1/responses", json=BODY | {"tools": [tool, tool | {"name": "g"}]}),
            400,
            "array_above_max_length",
        )
        assert error["param"] == "tools"
        chat = {"model": FAKE_MODEL, "messages": items[:1], "tools": [chat_tool] * 2}
        error_of(await http.post("/v1/chat/completions", json=chat), 400, "array_above_max_length")
        conv = await http.post("/v1/conversations", json={"items": items})
        assert error_of(conv, 400, "array_above_max_length")["param"] == "items"
        big_item = [{"role": "user", "content": "z" * 101}]
        conv = await http.post("/v1/conversations", json={"items": big_item})
        error_of(conv, 400, "string_above_max_length")
        made = (await http.post("/v1/conversations", json={"items": items[:1]})).json()
        added = await http.post(f"/v1/conversations/{made['id']}/items", json={"items": items})
        error_of(added, 400, "array_above_max_length")
        listed = await http.get(f"/v1/conversations/{made['id']}/items")
        assert len(listed.json()["data"]) == 1  # nothing stored half-way
        assert engine.calls == []
        at_limit = BODY | {"input": items[:3], "tools": [tool]}
        assert (await http.post("/v1/responses", json=at_limit)).status_code == 200


async def test_output_token_ceiling_on_both_apis(
    make_client: Callable[..., httpx.AsyncClient], engine: FakeEngine
) -> None:
    async with make_client(input_limits=InputLimits(max_output_tokens=64)) as http:
        over = await http.post("/v1/responses", json=BODY | {"max_output_tokens": 65})
        assert error_of(over, 400, "integer_above_max_value")["param"] == "max_output_tokens"
        chat = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]}
        for param in ("max_tokens", "max_completion_tokens"):
            r = await http.post("/v1/chat/completions", json=chat | {param: 100})
            assert error_of(r, 400, "integer_above_max_value")["param"] == param
        assert engine.calls == []
        ok = await http.post("/v1/responses", json=BODY | {"max_output_tokens": 64})
        assert ok.status_code == 200


def test_media_payloads_do_not_count_as_text() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 1000}
    text = {"type": "input_text", "text": "abc"}
    keys = len("rolecontent") + len("typetext") + len("typeimage_url")
    assert text_chars([{"role": "user", "content": [text, image]}]) == keys + len(
        "user" + "input_text" + "abc" + "input_image"
    )


# -- per-key rates and streams ----------------------------------------------------------------


async def test_requests_per_minute_per_key(make_client: Callable[..., httpx.AsyncClient]) -> None:
    keys = KeyRing(["sk-a", "sk-b"])
    async with make_client(keys=keys, quotas=QuotaSettings(requests_per_minute=2)) as http:
        a, b = {"x-api-key": "sk-a"}, {"x-api-key": "sk-b"}
        first = await http.post("/v1/responses", json=BODY, headers=a)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert (await http.post("/v1/responses", json=BODY, headers=a)).status_code == 200
        third = await http.post(
            "/v1/chat/completions",
            json={"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]},
            headers=a,
        )
        error = error_of(third, 429, "rate_limit_exceeded")
        assert error["type"] == "requests"
        assert 1 <= int(third.headers["retry-after"]) <= 60
        assert third.headers["x-ratelimit-remaining-requests"] == "0"
        assert third.headers["x-ratelimit-reset-requests"].endswith("s")
        other = await http.post("/v1/responses", json=BODY, headers=b)  # its own window
        assert other.status_code == 200
        assert (await http.get("/v1/models", headers=a)).status_code == 200  # not generating


def test_token_window_slides() -> None:
    now = [1000.0]
    quotas = KeyQuotas(QuotaSettings(tokens_per_minute=100), clock=lambda: now[0])
    assert quotas.admit("a")["x-ratelimit-remaining-tokens"] == "100"
    quotas.spend("a", 120)
    with pytest.raises(Exception) as refused:
        quotas.admit("a")
    assert getattr(refused.value, "status_code", None) == 429
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"  # type: ignore[attr-defined]
    assert quotas.admit("b")  # another identity is unaffected
    now[0] += 61
    assert quotas.admit("a")["x-ratelimit-remaining-tokens"] == "100"
    assert _duration(0.25) == "250ms" and _duration(6) == "6s" and _duration(360) == "6m0s"


@pytest.mark.waits
async def test_streams_per_key(make_client: Callable[..., httpx.AsyncClient]) -> None:
    engine = FakeEngine(respond=lambda *_: Reply(["a"] * 50, delay=0.01), model_id=FAKE_MODEL)
    app = create_app(engine, MemoryStore(), quotas=QuotaSettings(streams_per_key=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        stream = BODY | {"stream": True}
        chat = {
            "model": FAKE_MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
        }

        async def while_first_streams() -> list[httpx.Response]:
            await asyncio.sleep(0.1)
            assert app.state.quotas.open_streams("anonymous") == 1
            return [
                await http.post("/v1/responses", json=stream),
                await http.post("/v1/chat/completions", json=chat),
                await http.post("/v1/responses", json=BODY),  # not a stream
            ]

        first, (second, third, plain) = await asyncio.gather(
            http.post("/v1/responses", json=stream), while_first_streams()
        )
        assert first.status_code == 200 and "response.completed" in first.text
        error_of(second, 429, "rate_limit_exceeded")
        error_of(third, 429, "rate_limit_exceeded")
        assert plain.status_code == 200
        assert app.state.quotas.open_streams("anonymous") == 0  # given back at the end
        again = await http.post("/v1/responses", json=stream)
        assert again.status_code == 200
        assert len(engine.calls) == 3  # the refused streams never reached the engine


async def test_tokens_per_minute_are_charged_to_the_key(
    make_client: Callable[..., httpx.AsyncClient],
) -> None:
    keys = KeyRing(["sk-a", "sk-b"])
    async with make_client(keys=keys, quotas=QuotaSettings(tokens_per_minute=5)) as http:
        a, b = {"x-api-key": "sk-a"}, {"x-api-key": "sk-b"}
        first = await http.post("/v1/responses", json=BODY, headers=a)
        assert first.status_code == 200 and first.json()["usage"]["total_tokens"] > 5
        assert first.headers["x-ratelimit-limit-tokens"] == "5"
        chat = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "x"}]}
        refused = await http.post("/v1/chat/completions", json=chat, headers=a)
        error_of(refused, 429, "rate_limit_exceeded")
        assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
        assert refused.headers["x-ratelimit-reset-tokens"].endswith("s")
        assert (await http.post("/v1/chat/completions", json=chat, headers=b)).status_code == 200


# -- compressed bodies: each coding decodes to the same request, the limit bounds the
# decoded size (a bomb is a 413), an unknown or broken coding is a clear 4xx.

RAW = json.dumps(BODY | {"input": "hi there"}).encode()
ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}


@pytest.mark.parametrize("coding", sorted(ENCODERS))
async def test_each_coding_decodes_to_the_same_request(
    guarded: httpx.AsyncClient, engine: FakeEngine, coding: str
) -> None:
    r = await guarded.post(
        "/v1/responses",
        content=ENCODERS[coding](RAW),
        headers={"content-type": "application/json", "content-encoding": coding},
    )
    assert r.status_code == 200, r.text
    assert engine.calls[-1].prompt.request.messages[-1].text == "hi there"


async def test_raw_deflate_and_stacked_codings_decode(
    guarded: httpx.AsyncClient, engine: FakeEngine
) -> None:
    raw_deflate = zlib.compressobj(wbits=-15)
    body = raw_deflate.compress(RAW) + raw_deflate.flush()
    headers = {"content-type": "application/json", "content-encoding": "deflate"}
    assert (await guarded.post("/v1/responses", content=body, headers=headers)).status_code == 200
    stacked = brotli.compress(gzip.compress(RAW))
    headers["content-encoding"] = "gzip, br"
    r = await guarded.post("/v1/responses", content=stacked, headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("coding", sorted(ENCODERS))
async def test_a_bomb_is_413_by_its_decoded_size(
    guarded: httpx.AsyncClient, engine: FakeEngine, coding: str
) -> None:
    """The fixture's limit is 4096 bytes; 4 MiB of zeros (a thousand times the limit)
    compress to a few KiB or less."""
    bomb = ENCODERS[coding](b'{"model": "fake-model", "input": "' + b"0" * (4 << 20))
    assert len(bomb) < 4096 * 20
    r = await guarded.post(
        "/v1/responses",
        content=bomb[:4096] if len(bomb) > 4096 else bomb,
        headers={"content-type": "application/json", "content-encoding": coding},
    )
    error_of(r, 413, "request_too_large")
    assert engine.calls == []


async def test_unknown_and_broken_codings_are_refused(
    guarded: httpx.AsyncClient, engine: FakeEngine
) -> None:
    headers = {"content-type": "application/json", "content-encoding": "compress"}
    error_of(
        await guarded.post("/v1/responses", content=RAW, headers=headers),
        415,
        "unsupported_content_encoding",
    )
    headers["content-encoding"] = "gzip"
    error_of(
        await guarded.post("/v1/responses", content=b"not gzip", headers=headers),
        400,
        "invalid_content_encoding",
    )
    headers["content-encoding"] = "zstd"
    error_of(
        await guarded.post("/v1/responses", content=ENCODERS["zstd"](RAW)[:-6], headers=headers),
        400,
        "invalid_content_encoding",
    )
    headers["content-encoding"] = "identity"
    assert (await guarded.post("/v1/responses", content=RAW, headers=headers)).status_code == 200
    assert len(engine.calls) == 1
