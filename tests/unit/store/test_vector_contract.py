"""The vector store part of the store contract: memory, sqlite and postgresql behave alike
(`stores` builds each, see test_contract.py): ownership, counts, atomic ingestion results,
cascades, full-text ranking, vectors, batches, expiry and the storage they count."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from respd.service.vector_stores.fusion import cosine_ranking, pack
from respd.store.base import Store
from respd.store.vectors.records import (
    Chunk,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
    file_key,
    query_terms,
)
from tests.unit.store.test_contract import KINDS, Stores, run

NOW = 1_800_000_000
STRATEGY = {"type": "static", "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400}}


@pytest.fixture(params=KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    with ExitStack() as exits:
        yield Stores(request.param, tmp_path, exits)


def vs(sid: str, owner: str = "alice", expires_at: int | None = None) -> VectorStoreRecord:
    return VectorStoreRecord(sid, owner, NOW, f"name {sid}", {"k": "v"}, None, NOW, expires_at)


def vf(sid: str, fid: str, owner: str = "alice", **kw: Any) -> VectorFileRecord:
    return VectorFileRecord(sid, fid, owner, NOW, f"{fid}.txt", chunking=STRATEGY, **kw)


def test_stores_are_owned_listed_updated_and_deleted(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.put_vector_store(vs("vs_1"))
        await store.put_vector_store(vs("vs_2"))
        await store.put_vector_store(vs("vs_b", owner="bob"))
        got = await store.get_vector_store("alice", "vs_1")
        assert got is not None and got.name == "name vs_1" and got.metadata == {"k": "v"}
        assert got.file_counts["total"] == 0 and got.usage_bytes == 0
        assert await store.get_vector_store("bob", "vs_1") is None
        assert [r.id for r in await store.list_vector_stores("alice")] == ["vs_1", "vs_2"]
        changed = vs("vs_1")
        changed.name, changed.expires_after, changed.expires_at = "new", {"days": 1}, NOW + 9
        await store.put_vector_store(changed)
        got = await store.get_vector_store("alice", "vs_1")
        assert got is not None and got.name == "new" and got.expires_after == {"days": 1}
        # Another owner's write never takes a store over.
        await store.put_vector_store(vs("vs_1", owner="bob"))
        assert await store.get_vector_store("bob", "vs_1") is None
        assert not await store.delete_vector_store("bob", "vs_1")
        assert await store.delete_vector_store("alice", "vs_1")
        assert await store.get_vector_store("alice", "vs_1") is None

    run(stores.make(), body)


def test_finishing_is_atomic_and_only_for_the_running_attachment(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.put_vector_store(vs("vs_1"), [vf("vs_1", "file-a"), vf("vs_1", "file-b")])
        assert not await store.add_vector_files("bob", "vs_1", [vf("vs_1", "file-x", "bob")])
        a, b = await store.list_vector_files("alice", "vs_1")
        assert (a.file_id, a.status, b.file_id) == ("file-a", "in_progress", "file-b")
        assert await store.list_vector_files("bob", "vs_1") == []
        chunks = [Chunk("the quick brown fox"), Chunk("jumps over")]
        assert await store.finish_vector_file(a, chunks)
        assert not await store.finish_vector_file(a, chunks)  # finished once
        assert await store.finish_vector_file(b, [], {"code": "invalid_file", "message": "m"})
        a, b = await store.list_vector_files("alice", "vs_1")
        assert a.status == "completed" and a.usage_bytes == len("the quick brown foxjumps over")
        assert b.status == "failed" and b.last_error == {"code": "invalid_file", "message": "m"}
        got = await store.get_vector_store("alice", "vs_1")
        assert got is not None and got.usage_bytes == a.usage_bytes
        assert got.file_counts == {
            "in_progress": 0,
            "completed": 1,
            "failed": 1,
            "cancelled": 0,
            "total": 2,
        }
        texts = await store.vector_file_chunks("alice", "vs_1", "file-a")
        assert texts == ["the quick brown fox", "jumps over"]
        assert await store.vector_file_chunks("bob", "vs_1", "file-a") == []
        # A file deleted mid-ingestion keeps nothing of the late result.
        await store.add_vector_files("alice", "vs_1", [vf("vs_1", "file-c")])
        (c,) = [f for f in await store.list_vector_files("alice", "vs_1") if f.file_id == "file-c"]
        assert await store.delete_vector_file("alice", "vs_1", "file-c")
        assert not await store.finish_vector_file(c, [Chunk("late text")])
        keys = [file_key("vs_1", f) for f in ("file-a", "file-c")]
        hits = await store.lexical_chunks(keys, ["late", "quick"], 10)
        assert [h.text for h in hits] == ["the quick brown fox"]

    run(stores.make(), body)


def test_attaching_again_restarts_a_file_and_drops_its_chunks(stores: Stores) -> None:
    async def body(store: Store) -> None:
        first = vf("vs_1", "file-a")
        await store.put_vector_store(vs("vs_1"), [first])
        await store.finish_vector_file(first, [Chunk("alpha words")])
        again = vf("vs_1", "file-a", attributes={"v": 2})
        again.created_at = NOW + 5
        await store.add_vector_files("alice", "vs_1", [again])
        (f,) = await store.list_vector_files("alice", "vs_1")
        assert f.status == "in_progress" and f.attributes == {"v": 2}
        assert await store.vector_file_chunks("alice", "vs_1", "file-a") == []
        assert not await store.finish_vector_file(first, [Chunk("stale")])
        assert await store.finish_vector_file(again, [Chunk("beta words")])
        assert await store.vector_file_chunks("alice", "vs_1", "file-a") == ["beta words"]

    run(stores.make(), body)


def test_full_text_ranks_the_chunk_that_holds_the_rare_words_first(stores: Stores) -> None:
    async def body(store: Store) -> None:
        files = [vf("vs_1", f"file-{i}") for i in range(3)]
        await store.put_vector_store(vs("vs_1"), files)
        texts = [
            "the weather report says rain and wind over the harbour today",
            "the lighthouse keeper logged a zeppelin sighting over the harbour",
            "the harbour master collects mooring fees every month",
        ]
        for record, text in zip(files, texts, strict=True):
            await store.finish_vector_file(record, [Chunk(text)])
        keys = [file_key("vs_1", f.file_id) for f in files]
        hits = await store.lexical_chunks(keys, query_terms("zeppelin over harbour?"), 10)
        assert hits[0].file_id == "file-1" and hits[0].score > hits[-1].score
        assert {h.file_id for h in hits} == {"file-0", "file-1", "file-2"}  # all say harbour
        # Only the files named are searched; quotes and operators are plain words.
        only = await store.lexical_chunks(keys[:1], query_terms('zeppelin "OR" NEAR(*'), 10)
        assert only == []
        assert await store.lexical_chunks(keys, [], 10) == []

    run(stores.make(), body)


def test_vectors_round_trip_for_the_named_files(stores: Stores) -> None:
    async def body(store: Store) -> None:
        a, b = vf("vs_1", "file-a"), vf("vs_1", "file-b")
        await store.put_vector_store(vs("vs_1"), [a, b])
        await store.finish_vector_file(a, [Chunk("one", b"\x00\x00\x80?"), Chunk("two")])
        await store.finish_vector_file(b, [Chunk("three", b"\x00\x00\x00@")])
        rows = await store.chunk_vectors([file_key("vs_1", "file-a")])
        assert [blob for _, blob in rows] == [b"\x00\x00\x80?"]
        hits = await store.chunks_by_id([rows[0][0]])
        assert [(h.file_id, h.text) for h in hits] == [("file-a", "one")]
        assert await store.chunk_vectors([]) == [] and await store.chunks_by_id([]) == []

    run(stores.make(), body)


def test_batches_cancel_their_unfinished_files(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.put_vector_store(vs("vs_1"))
        batch = FileBatchRecord("vsfb_1", "vs_1", "alice", NOW)
        files = [vf("vs_1", "file-a", batch_id="vsfb_1"), vf("vs_1", "file-b", batch_id="vsfb_1")]
        assert await store.add_vector_files("alice", "vs_1", files, batch)
        await store.finish_vector_file(files[0], [Chunk("done")])
        assert await store.get_file_batch("bob", "vs_1", "vsfb_1") is None
        assert not await store.cancel_file_batch("bob", "vs_1", "vsfb_1")
        assert await store.cancel_file_batch("alice", "vs_1", "vsfb_1")
        got = await store.get_file_batch("alice", "vs_1", "vsfb_1")
        assert got is not None and got.cancelled
        statuses = {f.file_id: f.status for f in await store.list_vector_files("alice", "vs_1")}
        assert statuses == {"file-a": "completed", "file-b": "cancelled"}
        assert await store.pending_vector_files() == []

    run(stores.make(), body)


def test_pending_files_attributes_and_cascading_deletes(stores: Stores) -> None:
    async def body(store: Store) -> None:
        a = vf("vs_1", "file-a")
        await store.put_vector_store(vs("vs_1"), [a])
        await store.put_vector_store(vs("vs_2", owner="bob"), [vf("vs_2", "file-z", "bob")])
        assert sorted(f.file_id for f in await store.pending_vector_files()) == [
            "file-a",
            "file-z",
        ]
        updated = await store.update_vector_file("alice", "vs_1", "file-a", {"n": 1.5})
        assert updated is not None and updated.attributes == {"n": 1.5}
        assert await store.update_vector_file("bob", "vs_1", "file-a", {}) is None
        await store.finish_vector_file(a, [Chunk("kept text")])
        assert await store.owner_bytes("alice") >= len("kept text")
        assert await store.delete_vector_store("alice", "vs_1")
        assert await store.chunk_vectors([file_key("vs_1", "file-a")]) == []
        assert await store.lexical_chunks([file_key("vs_1", "file-a")], ["kept"], 5) == []
        assert await store.list_vector_files("alice", "vs_1") == []

    run(stores.make(), body)


def test_purge_removes_expired_vector_stores(stores: Stores) -> None:
    async def body(store: Store) -> None:
        old = vf("vs_old", "file-a")
        await store.put_vector_store(vs("vs_old", expires_at=int(stores.clock.now) - 1), [old])
        await store.finish_vector_file(old, [Chunk("gone soon")])
        await store.put_vector_store(vs("vs_new", expires_at=int(stores.clock.now) + 60))
        assert await store.purge_expired() >= 1
        assert await store.get_vector_store("alice", "vs_old") is None
        assert await store.get_vector_store("alice", "vs_new") is not None
        assert await store.lexical_chunks([file_key("vs_old", "file-a")], ["gone"], 5) == []

    run(stores.make(), body)


def test_vector_stores_survive_reopening(stores: Stores) -> None:
    if stores.kind == "memory":
        return  # one process, one map: nothing to reopen

    async def write(store: Store) -> None:
        a = vf("vs_1", "file-a")
        await store.put_vector_store(vs("vs_1"), [a])
        await store.finish_vector_file(a, [Chunk("persistent words")])

    async def read(store: Store) -> None:
        hits = await store.lexical_chunks([file_key("vs_1", "file-a")], ["persistent"], 5)
        assert [h.text for h in hits] == ["persistent words"]

    run(stores.make(), write)
    run(stores.make(), read)


def _vectors(rng: random.Random, width: int, count: int) -> list[list[float]]:
    """Random vectors whose dot products and squared norms float32 holds exactly (quarter
    steps of at most 25), so that a tie is a tie to both rankings, whatever order each sums
    in."""
    return [[rng.randint(-100, 100) / 4 for _ in range(width)] for _ in range(count)]


def test_nearest_chunks_ranks_as_the_numpy_scan_or_declines(stores: Stores) -> None:
    rng = random.Random(7)
    widths = (3, 8, 16)

    async def body(store: Store) -> None:
        files = [vf("vs_1", "file-a"), vf("vs_1", "file-b"), vf("vs_2", "file-c")]
        await store.put_vector_store(vs("vs_1"), files[:2])
        await store.put_vector_store(vs("vs_2"), files[2:])
        for n, record in enumerate(files):
            vectors = [v for w in widths for v in _vectors(rng, w, 20)]
            # Ties: the same vector twice, a vector and its double, zero vectors (scored 0).
            vectors += [vectors[n], vectors[n], [2 * x for x in vectors[20 + n]], [0.0] * 8]
            rng.shuffle(vectors)
            chunks = [Chunk(f"c{i}", pack(v)) for i, v in enumerate(vectors)] + [Chunk("none")]
            await store.finish_vector_file(record, chunks)
        keys = [file_key("vs_1", "file-a"), file_key("vs_2", "file-c")]  # not file-b
        rows = await store.chunk_vectors(keys)
        queries = [q for w in (*widths, 5) for q in _vectors(rng, w, 4)] + [[0.0] * 8, []]
        queries += [[float(x) for x in np.frombuffer(blob, "<f4")] for _, blob in rows[:3]]
        agreed = 0
        for query in queries:
            for limit in (1, 7, 200):
                got = await store.nearest_chunks(keys, query, limit)
                if stores.kind != "sqlite":
                    assert got is None  # ranked by the service, in numpy
                    continue
                assert got == cosine_ranking(rows, query, limit), (query, limit)
                agreed += bool(got)
        assert stores.kind != "sqlite" or agreed == 3 * (len(queries) - 6)
        assert await store.nearest_chunks([], [1.0, 2.0, 3.0], 5) in ([], None)

    run(stores.make(), body)
