"""`/v1/embeddings` on the app and the package's `FakeEmbedder`, through the `openai` SDK
(its own types parse every answer): shapes, base64, `dimensions`, usage, the model list,
and every bad input a 400 or 404 that names its field."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from respd.api.app import create_app
from respd.engines.fake import FakeEmbedder, FakeEngine
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL

EMBED = "fake-embed"


@pytest.fixture()
def embedder() -> FakeEmbedder:
    return FakeEmbedder(EMBED, width=32, max_tokens=100)


@pytest.fixture()
def app(engine: FakeEngine, embedder: FakeEmbedder) -> FastAPI:
    return create_app(engine, MemoryStore(), embedders=[embedder])


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_vectors_are_unit_length_in_order_with_usage(sdk: openai.AsyncOpenAI) -> None:
    texts = ["the cat sat on the mat", "a cat on a mat", "stock markets fell"]
    r = await sdk.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    assert r.object == "list" and r.model == EMBED
    assert [d.index for d in r.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == 32 for d in r.data)
    assert all(math.isclose(_dot(d.embedding, d.embedding), 1.0) for d in r.data)
    v = [d.embedding for d in r.data]
    assert _dot(v[0], v[1]) > _dot(v[0], v[2])  # shared words point the same way
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, texts))


async def test_embedded_tokens_are_counted_by_model(http: httpx.AsyncClient) -> None:
    await http.post("/v1/embeddings", json={"model": EMBED, "input": ["abc", "de"]})
    text = (await http.get("/metrics")).text
    assert f'respd_embedding_input_tokens_total{{model="{EMBED}"}} 5.0' in text


async def test_base64_is_the_float32_bytes_of_the_same_vector(http: httpx.AsyncClient) -> None:
    body = {"model": EMBED, "input": "hello there"}
    floats = (await http.post("/v1/embeddings", json=body)).json()["data"][0]["embedding"]
    r = await http.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
    packed = base64.b64decode(r.json()["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert len(decoded) == len(floats)
    assert all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(decoded, floats, strict=True)
    )


async def test_the_sdk_default_asks_for_base64_and_reads_floats(sdk: openai.AsyncOpenAI) -> None:
    r = await sdk.embeddings.create(model=EMBED, input="hello there")
    assert len(r.data[0].embedding) == 32
    assert math.isclose(_dot(r.data[0].embedding, r.data[0].embedding), 1.0, rel_tol=1e-5)


async def test_dimensions_cut_the_vector_and_keep_it_unit_length(sdk: openai.AsyncOpenAI) -> None:
    full = await sdk.embeddings.create(model=EMBED, input="one two three", encoding_format="float")
    cut = await sdk.embeddings.create(
        model=EMBED, input="one two three", dimensions=8, encoding_format="float"
    )
    assert len(cut.data[0].embedding) == 8
    assert math.isclose(_dot(cut.data[0].embedding, cut.data[0].embedding), 1.0)
    head = full.data[0].embedding[:8]
    norm = math.sqrt(_dot(head, head)) or 1.0
    assert all(math.isclose(a, b / norm) for a, b in zip(cut.data[0].embedding, head, strict=True))


async def test_token_inputs_are_embedded_as_given(
    http: httpx.AsyncClient, embedder: FakeEmbedder
) -> None:
    one = await http.post("/v1/embeddings", json={"model": EMBED, "input": [104, 105]})
    assert one.status_code == 200 and len(one.json()["data"]) == 1
    many = await http.post("/v1/embeddings", json={"model": EMBED, "input": [[104], [105, 106]]})
    assert len(many.json()["data"]) == 2 and many.json()["usage"]["prompt_tokens"] == 3
    assert embedder.calls[-2:] == [[[104, 105]], [[104], [105, 106]]]


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": "hi", "model": "nope"}, 404, "model", "model_not_found"),
        ({"input": "hi", "model": FAKE_MODEL}, 404, "model", "model_not_found"),
        ({"model": EMBED}, 400, "input", "missing_required_parameter"),
        ({"model": EMBED, "input": []}, 400, "input", "invalid_value"),
        ({"model": EMBED, "input": ["a", ""]}, 400, "input[1]", "invalid_value"),
        ({"model": EMBED, "input": ["a", "b" * 101]}, 400, "input[1]", "context_length_exceeded"),
        ({"model": EMBED, "input": ["a"] * 2049}, 400, "input", "invalid_value"),
        ({"model": EMBED, "input": "a", "dimensions": 33}, 400, "dimensions", "invalid_value"),
        ({"model": EMBED, "input": "a", "dimensions": 0}, 400, "dimensions", None),
        ({"model": EMBED, "input": "a", "encoding_format": "int8"}, 400, "encoding_format", None),
        ({"model": EMBED, "input": [[1, -2]]}, 400, "input", None),
        ({"model": EMBED, "input": [1, "a"]}, 400, "input", None),
    ],
)
async def test_bad_requests_name_their_field(
    http: httpx.AsyncClient,
    embedder: FakeEmbedder,
    body: dict[str, Any],
    status: int,
    param: str,
    code: str | None,
) -> None:
    r = await http.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] is not None and error["param"].startswith(param), error
    if code is not None:
        assert error["code"] == code, error


async def test_the_model_list_shows_the_embedding_model(sdk: openai.AsyncOpenAI) -> None:
    ids = [m.id async for m in sdk.models.list()]
    assert ids == [FAKE_MODEL, EMBED]
    card = await sdk.models.retrieve(EMBED)
    assert card.id == EMBED and (card.model_extra or {}).get("endpoints") == ["/v1/embeddings"]


async def test_text_past_the_character_limit_is_refused_before_tokenizing(
    engine: FakeEngine, embedder: FakeEmbedder
) -> None:
    from respd.service.limits import InputLimits

    limits = InputLimits(max_chars=50)
    app = create_app(engine, MemoryStore(), embedders=[embedder], input_limits=limits)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        body = {"model": EMBED, "input": ["a" * 30, "b" * 30]}
        r = await client.post("/v1/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "string_above_max_length"
    assert not embedder.calls


@pytest.fixture()
async def keyed(engine: FakeEngine, embedder: FakeEmbedder) -> AsyncIterator[httpx.AsyncClient]:
    from respd.api.identity import KeyRing

    app = create_app(engine, MemoryStore(), embedders=[embedder], keys=KeyRing(["sk-right"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as client:
        yield client


async def test_embeddings_need_a_key_where_keys_are_set(keyed: httpx.AsyncClient) -> None:
    body = {"model": EMBED, "input": "hi"}
    refused = await keyed.post("/v1/embeddings", json=body)
    assert refused.status_code == 401
    ok = await keyed.post("/v1/embeddings", json=body, headers={"authorization": "Bearer sk-right"})
    assert ok.status_code == 200
