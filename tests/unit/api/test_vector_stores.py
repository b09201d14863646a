"""The Vector Stores API on the app, in process, through the `openai` SDK (its own types
parse every answer): stores, files, batches, search (full-text, and hybrid with an
embedder), ownership, and every 4xx naming its field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai.types import VectorStore, VectorStoreSearchResponse
from openai.types.vector_stores import VectorStoreFile, VectorStoreFileBatch

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.engines.embedding import EmbeddingInput, Embeddings, normalized
from respd.engines.fake import FakeEngine
from respd.service.vector_stores.service import SearchHit, VectorStores
from respd.store import MemoryStore, SqliteStore, Store
from respd.store.vectors.records import CANCELLED

KEY_A, KEY_B = "sk-alice-0123456789", "sk-bob-9876543210"
DOCS = {
    "harbour.txt": "The lighthouse keeper logged a zeppelin over the harbour at dawn.",
    "cooking.md": "# Risotto\nStir the rice slowly and add warm stock, a ladle at a time.",
    "garden.txt": "Prune the roses in early spring, before the new buds open.",
}
CONCEPTS = [
    {"car", "automobile", "vehicle", "sedan"},
    {"cat", "feline", "kitten"},
    {"money", "cash", "currency"},
]


class ConceptEmbedder:
    """Vectors by meaning, not spelling: words of one concept share a dimension, so a
    paraphrase with no word in common still points the same way."""

    model_id = "concepts"
    max_tokens: int | None = None

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        vectors = []
        for item in inputs:
            words = str(item).lower().replace(".", " ").split()
            vector = [sum(w in c for w in words) * 1.0 for c in CONCEPTS] + [0.05]
            vectors.append(normalized(vector))
        return Embeddings(vectors, sum(len(str(i)) for i in inputs))

    def close(self) -> None:
        pass


class Harness:
    def __init__(self, app: FastAPI, http: httpx.AsyncClient) -> None:
        self.app = app
        self.http = http
        self.a = self.client(KEY_A)
        self.b = self.client(KEY_B)

    @property
    def service(self) -> VectorStores:
        return self.app.state.vector_stores

    def client(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://respd.test/v1", api_key=key, http_client=self.http, max_retries=0
        )

    async def upload(self, name: str, text: str, client: openai.AsyncOpenAI | None = None) -> str:
        made = await (client or self.a).files.create(
            file=(name, text.encode()), purpose="assistants"
        )
        return made.id

    async def docs(self) -> dict[str, str]:
        return {name: await self.upload(name, text) for name, text in DOCS.items()}

    async def post(self, path: str, body: Any, key: str = KEY_A) -> httpx.Response:
        return await self.http.post(path, json=body, headers={"authorization": f"Bearer {key}"})

    async def get(self, path: str, key: str = KEY_A) -> httpx.Response:
        return await self.http.get(path, headers={"authorization": f"Bearer {key}"})


def _app(store: Store, embedder: Any = None) -> FastAPI:
    return create_app(
        FakeEngine(), store, keys=KeyRing([KEY_A, KEY_B]), file_search_embedder=embedder
    )


async def _harness(app: FastAPI) -> AsyncIterator[Harness]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://respd.test") as http:
        harness = Harness(app, http)
        yield harness
        await harness.service.close()


@pytest.fixture()
async def h() -> AsyncIterator[Harness]:
    async for harness in _harness(_app(MemoryStore())):
        yield harness


async def _ready(h: Harness, store_id: str) -> VectorStore:
    await h.service.ingestor.wait()
    return await h.a.vector_stores.retrieve(store_id)


async def test_create_ingest_and_search_ranks_the_one_document_first(h: Harness) -> None:
    ids = await h.docs()
    made = await h.a.vector_stores.create(
        name="notes", file_ids=list(ids.values()), metadata={"team": "x"}
    )
    assert made.object == "vector_store" and made.name == "notes" and made.metadata == {"team": "x"}
    assert made.file_counts.total == 3
    done = await _ready(h, made.id)
    assert done.status == "completed" and done.file_counts.completed == 3
    assert done.usage_bytes >= sum(len(t) for t in DOCS.values()) - 10
    files = [f async for f in h.a.vector_stores.files.list(made.id)]
    assert {f.id for f in files} == set(ids.values())
    assert all(isinstance(f, VectorStoreFile) and f.status == "completed" for f in files)
    assert files[0].chunking_strategy is not None and files[0].chunking_strategy.type == "static"
    page = await h.a.vector_stores.search(made.id, query="zeppelin over the lighthouse")
    hits = [hit async for hit in page]
    assert all(isinstance(hit, VectorStoreSearchResponse) for hit in hits)
    assert hits[0].file_id == ids["harbour.txt"] and hits[0].filename == "harbour.txt"
    assert 0 < hits[0].score <= 1 and hits[0].content[0].text == DOCS["harbour.txt"]
    raw = (await h.post(f"/v1/vector_stores/{made.id}/search", {"query": "risotto"})).json()
    assert raw["object"] == "vector_store.search_results.page"
    assert [d["file_id"] for d in raw["data"]] == [ids["cooking.md"]]


async def test_search_options_threshold_limit_and_query_lists(h: Harness) -> None:
    ids = await h.docs()
    made = await h.a.vector_stores.create(file_ids=list(ids.values()))
    await _ready(h, made.id)
    hits = [
        x async for x in await h.a.vector_stores.search(made.id, query="the", max_num_results=2)
    ]
    assert len(hits) == 2
    both = await h.a.vector_stores.search(made.id, query=["roses", "risotto"], rewrite_query=True)
    assert {x.filename async for x in both} == {"garden.txt", "cooking.md"}
    strict = await h.a.vector_stores.search(
        made.id, query=["roses", "risotto"], ranking_options={"score_threshold": 0.9}
    )
    assert [x async for x in strict] == []  # each is first in one of two rankings: 0.5


async def test_attributes_filters_update_and_content(h: Harness) -> None:
    ids = await h.docs()
    store = await h.a.vector_stores.create(name="f")
    for year, (name, fid) in enumerate(ids.items(), start=2020):
        made = await h.a.vector_stores.files.create(
            vector_store_id=store.id, file_id=fid, attributes={"year": year, "name": name}
        )
        assert made.status == "in_progress" and made.attributes == {"year": year, "name": name}
    await _ready(h, store.id)
    flt: Any = {"type": "gte", "key": "year", "value": 2021}
    found = await h.a.vector_stores.search(store.id, query="the", filters=flt)
    assert {x.filename async for x in found} == {"cooking.md", "garden.txt"}
    either: Any = {
        "type": "or",
        "filters": [
            {"type": "eq", "key": "name", "value": "harbour.txt"},
            {"type": "in", "key": "year", "value": [2022]},
        ],
    }
    found = await h.a.vector_stores.search(store.id, query="the", filters=either)
    assert {x.filename async for x in found} == {"harbour.txt", "garden.txt"}
    updated = await h.a.vector_stores.files.update(
        file_id=ids["garden.txt"], vector_store_id=store.id, attributes={"year": 1999}
    )
    assert updated.attributes == {"year": 1999}
    found = await h.a.vector_stores.search(store.id, query="roses", filters=flt)
    assert [x async for x in found] == []
    content = [
        c
        async for c in h.a.vector_stores.files.content(ids["cooking.md"], vector_store_id=store.id)
    ]
    assert [(c.type, c.text) for c in content] == [("text", DOCS["cooking.md"])]
    gone = await h.a.vector_stores.files.delete(ids["cooking.md"], vector_store_id=store.id)
    assert gone.deleted and gone.object == "vector_store.file.deleted"
    found = await h.a.vector_stores.search(store.id, query="risotto")
    assert [x async for x in found] == []


async def test_list_pages_update_and_delete(h: Harness) -> None:
    made = [await h.a.vector_stores.create(name=f"s{i}") for i in range(3)]
    ids = [m.id for m in made]
    newest = await h.a.vector_stores.list(limit=2)
    assert [s.id for s in newest.data] == ids[::-1][:2] and newest.has_more
    assert [s.id async for s in h.a.vector_stores.list(limit=1, order="asc")] == ids
    before = (await h.get(f"/v1/vector_stores?order=asc&before={ids[2]}&limit=1")).json()
    assert [s["id"] for s in before["data"]] == [ids[1]] and before["has_more"]
    changed = await h.a.vector_stores.update(
        ids[0],
        name="renamed",
        metadata={"a": "b"},
        expires_after={"anchor": "last_active_at", "days": 2},
    )
    assert changed.name == "renamed" and changed.metadata == {"a": "b"}
    assert changed.expires_after is not None and changed.expires_after.days == 2
    assert changed.expires_at == changed.last_active_at + 2 * 86400
    cleared = (await h.post(f"/v1/vector_stores/{ids[0]}", {"expires_after": None})).json()
    assert cleared["expires_after"] is None and cleared["name"] == "renamed"
    deleted = await h.a.vector_stores.delete(ids[0])
    assert deleted.deleted and deleted.object == "vector_store.deleted"
    with pytest.raises(openai.NotFoundError):
        await h.a.vector_stores.retrieve(ids[0])


async def test_batches_from_ids_and_from_files_and_cancel(h: Harness) -> None:
    ids = list((await h.docs()).values())
    store = await h.a.vector_stores.create()
    batch = await h.a.vector_stores.file_batches.create(
        store.id, file_ids=ids[:2], attributes={"src": "batch"}
    )
    assert isinstance(batch, VectorStoreFileBatch) and batch.file_counts.total == 2
    await h.service.ingestor.wait()
    done = await h.a.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
    assert done.status == "completed" and done.file_counts.completed == 2
    listed = h.a.vector_stores.file_batches.list_files(batch.id, vector_store_id=store.id)
    assert {f.id async for f in listed} == set(ids[:2])
    # Hold every ingestion slot, so that the next batch is still running when cancelled.
    slots = h.service.ingestor._slots
    for _ in range(2):
        await slots.acquire()
    try:
        second = await h.a.vector_stores.file_batches.create(
            store.id, files=[{"file_id": ids[2], "attributes": {"one": True}}]
        )
        assert second.status == "in_progress"
        cancelled = await h.a.vector_stores.file_batches.cancel(second.id, vector_store_id=store.id)
        assert cancelled.status == CANCELLED and cancelled.file_counts.cancelled == 1
    finally:
        slots.release()
        slots.release()
    await h.service.ingestor.wait()
    f = await h.a.vector_stores.files.retrieve(ids[2], vector_store_id=store.id)
    assert f.status == "cancelled" and f.attributes == {"one": True}
    only = h.a.vector_stores.files.list(store.id, filter="cancelled")
    assert [x.id async for x in only] == [ids[2]]


async def test_unreadable_files_fail_with_last_error(h: Harness) -> None:
    png = await h.a.files.create(
        file=("img.png", b"\x89PNG\r\n\x1a\n" + bytes(64)), purpose="assistants"
    )
    bad = await h.a.files.create(file=("bad.txt", b"\xff\xfe\x00bad"), purpose="assistants")
    store = await h.a.vector_stores.create(file_ids=[png.id, bad.id])
    done = await _ready(h, store.id)
    assert done.file_counts.failed == 2 and done.status == "completed"
    errors = {f.id: f.last_error async for f in h.a.vector_stores.files.list(store.id)}
    assert errors[png.id] is not None and errors[png.id].code == "unsupported_file"
    assert errors[bad.id] is not None and errors[bad.id].code == "invalid_file"


async def test_another_key_sees_nothing(h: Harness) -> None:
    fid = await h.upload("harbour.txt", DOCS["harbour.txt"])
    store = await h.a.vector_stores.create(file_ids=[fid])
    await _ready(h, store.id)
    calls: list[Callable[[], Any]] = [
        lambda: h.b.vector_stores.retrieve(store.id),
        lambda: h.b.vector_stores.update(store.id, name="mine"),
        lambda: h.b.vector_stores.delete(store.id),
        lambda: h.b.vector_stores.search(store.id, query="zeppelin"),
        lambda: h.b.vector_stores.files.list(store.id),
        lambda: h.b.vector_stores.files.retrieve(fid, vector_store_id=store.id),
        lambda: h.b.vector_stores.files.delete(fid, vector_store_id=store.id),
        lambda: h.b.vector_stores.file_batches.create(store.id, file_ids=[fid]),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            await call()
    assert [s async for s in h.b.vector_stores.list()] == []
    # Nor can key B attach key A's file to a store of its own.
    own = await h.b.vector_stores.create()
    with pytest.raises(openai.NotFoundError) as caught:
        await h.b.vector_stores.files.create(vector_store_id=own.id, file_id=fid)
    assert caught.value.body["param"] == "file_id"  # type: ignore[index]
    assert (await h.a.vector_stores.retrieve(store.id)).name == ""


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (
            "",
            {
                "chunking_strategy": {
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 50, "chunk_overlap_tokens": 0},
                },
                "file_ids": ["file-x"],
            },
            400,
            "chunking_strategy.static.max_chunk_size_tokens",
        ),
        (
            "",
            {
                "chunking_strategy": {
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 150},
                }
            },
            400,
            "chunking_strategy.static.chunk_overlap_tokens",
        ),
        ("", {"file_ids": ["file-nope"]}, 404, "file_ids[0]"),
        ("", {"expires_after": {"anchor": "created_at", "days": 1}}, 400, "expires_after.anchor"),
        ("", {"expires_after": {"anchor": "last_active_at", "days": 0}}, 400, "expires_after.days"),
        ("", {"metadata": {str(i): "v" for i in range(17)}}, 400, "metadata"),
        ("", {"name": 5}, 400, "name"),
        ("/files", {"file_id": "file-nope"}, 404, "file_id"),
        ("/files", {}, 400, "file_id"),
        (
            "/files",
            {"file_id": "{fid}", "attributes": {str(i): 1 for i in range(17)}},
            400,
            "attributes",
        ),
        ("/files", {"file_id": "{fid}", "attributes": {"k": [1]}}, 400, "attributes.k"),
        ("/search", {}, 400, "query"),
        ("/search", {"query": ""}, 400, "query"),
        ("/search", {"query": "x", "max_num_results": 0}, 400, "max_num_results"),
        ("/search", {"query": "x", "max_num_results": 51}, 400, "max_num_results"),
        (
            "/search",
            {"query": "x", "filters": {"type": "like", "key": "a", "value": 1}},
            400,
            "filters.type",
        ),
        (
            "/search",
            {"query": "x", "ranking_options": {"ranker": "best"}},
            400,
            "ranking_options.ranker",
        ),
        (
            "/search",
            {"query": "x", "ranking_options": {"score_threshold": 2}},
            400,
            "ranking_options.score_threshold",
        ),
        ("/file_batches", {}, 400, "file_ids"),
        ("/file_batches", {"file_ids": ["{fid}"], "files": []}, 400, "file_ids"),
        ("/file_batches", {"files": [{"file_id": "file-nope"}]}, 404, "files[0]"),
        ("/file_batches", {"file_ids": []}, 400, "file_ids"),
        (
            "/file_batches",
            {"files": [{"file_id": "{fid}", "attributes": {"k": None}}]},
            400,
            "files[0].attributes.k",
        ),
    ],
)
async def test_bad_requests_are_openai_errors_naming_the_field(
    h: Harness, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    fid = await h.upload("a.txt", "alpha")
    store = await h.a.vector_stores.create()
    target = "/v1/vector_stores" + (f"/{store.id}{path}" if path else "")
    sent = json.loads(json.dumps(body).replace("{fid}", fid))
    response = await h.post(target, sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert [s.id async for s in h.a.vector_stores.list()] == [store.id]  # nothing half-made


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/v1/vector_stores/vs_nope", "vector_store_id"),
        ("/v1/vector_stores/{sid}/files/file-nope", "file_id"),
        ("/v1/vector_stores/{sid}/files?filter=done", "filter"),
        ("/v1/vector_stores/{sid}/file_batches/vsfb_nope", "batch_id"),
        ("/v1/vector_stores?limit=0", "limit"),
        ("/v1/vector_stores?after=vs_nope", "after"),
    ],
)
async def test_bad_reads_name_the_field(h: Harness, path: str, param: str) -> None:
    store = await h.a.vector_stores.create()
    response = await h.get(path.replace("{sid}", store.id))
    assert response.status_code in (400, 404)
    assert response.json()["error"]["param"] == param


async def test_expired_stores_say_so_and_are_purged(h: Harness) -> None:
    store = await h.a.vector_stores.create(expires_after={"anchor": "last_active_at", "days": 1})
    h.service.clock = lambda: store.created_at + 2 * 86400
    got = await h.a.vector_stores.retrieve(store.id)
    assert got.status == "expired"
    response = await h.post(f"/v1/vector_stores/{store.id}/search", {"query": "x"})
    assert (
        response.status_code == 400 and response.json()["error"]["code"] == "vector_store_expired"
    )
    await h.service.store.purge_expired()  # the store's own clock is real time: not yet
    assert (await h.a.vector_stores.retrieve(store.id)).id == store.id


async def test_the_python_entry_point_for_file_search(h: Harness) -> None:
    ids = await h.docs()
    one = await h.a.vector_stores.create(file_ids=[ids["harbour.txt"]])
    two = await h.a.vector_stores.create(file_ids=[ids["garden.txt"]])
    await h.service.ingestor.wait()
    owner = next(iter({r.owner for r in await _all_records(h)}))
    hits = await h.service.search(owner, [one.id, two.id], "roses zeppelin", max_num_results=5)
    assert {x.filename for x in hits} == {"harbour.txt", "garden.txt"}
    assert all(isinstance(x, SearchHit) and 0 < x.score <= 1 for x in hits)
    with pytest.raises(Exception) as caught:
        await h.service.search("someone-else", [one.id], "roses")
    assert getattr(caught.value, "status_code", None) == 404
    assert getattr(caught.value, "param", None) == "vector_store_ids"


async def _all_records(h: Harness) -> list[Any]:
    store: MemoryStore = h.service.store  # type: ignore[assignment]
    return [s.record for s in store._vectors.stores.values()]


async def test_hybrid_search_finds_a_paraphrase_with_no_shared_word() -> None:
    for embedder, expect in ((ConceptEmbedder(), True), (None, False)):
        async for h in _harness(_app(MemoryStore(), embedder)):
            a = await h.upload("cars.txt", "My sedan broke down on the highway.")
            b = await h.upload("pets.txt", "The kitten slept on the sofa all day.")
            store = await h.a.vector_stores.create(file_ids=[a, b])
            await _ready(h, store.id)
            found = [x async for x in await h.a.vector_stores.search(store.id, query="automobile")]
            if expect:
                assert found[0].file_id == a and found[0].score > 0
            else:
                assert found == []  # full-text alone cannot find it


async def test_sqlite_store_serves_the_same_api(tmp_path: Path) -> None:
    async for h in _harness(_app(SqliteStore(tmp_path / "db.sqlite3"), ConceptEmbedder())):
        ids = await h.docs()
        store = await h.a.vector_stores.create(file_ids=list(ids.values()))
        await _ready(h, store.id)
        hits = [x async for x in await h.a.vector_stores.search(store.id, query="zeppelins")]
        assert hits[0].filename == "harbour.txt"  # porter stemming: zeppelins ~ zeppelin
        again = await h.a.vector_stores.delete(store.id)
        assert again.deleted
        await asyncio.sleep(0)
