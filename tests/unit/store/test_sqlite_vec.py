"""The SQLite store ranks vectors with sqlite-vec in a second, read-only connection, and
hybrid search uses it; without `sqlean`, the store declines (one warning) and search ranks
the same chunks in numpy."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from respd.engines.embedding import EmbeddingInput, Embeddings
from respd.service.vector_stores import search
from respd.service.vector_stores.fusion import pack
from respd.store import SqliteStore
from respd.store.vectors.records import Chunk, VectorFileRecord, VectorStoreRecord, file_key

NOW = 1_800_000_000
CHUNKS = {  # text: vector; no word in common with the queries, so only vectors find them
    "alpha": [1.0, 0.0, 0.0, 0.0],
    "beta": [0.6, 0.8, 0.0, 0.0],
    "gamma": [0.0, 1.0, 0.0, 0.0],
    "delta": [-1.0, 0.0, 0.0, 0.0],
    "epsilon": [1.0, 0.0, 0.0],  # another model's width: never ranked
}
QUERIES = {"north": [1.0, 0.1, 0.0, 0.0], "east": [0.0, 1.0, 0.0, 0.0]}


class TableEmbedder:
    """The queries' vectors, from a table."""

    model_id = "table"
    max_tokens: int | None = None

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        return Embeddings([QUERIES[str(i)] for i in inputs], len(inputs))

    def close(self) -> None:
        pass


async def _filled(path: Path) -> tuple[SqliteStore, list[str]]:
    store = SqliteStore(path)
    await store.put_vector_store(VectorStoreRecord("vs_1", "alice", NOW, "s", {}, None, NOW))
    record = VectorFileRecord("vs_1", "file-a", "alice", NOW, "a.txt")
    await store.add_vector_files("alice", "vs_1", [record])
    await store.finish_vector_file(record, [Chunk(t, pack(v)) for t, v in CHUNKS.items()])
    return store, [file_key("vs_1", "file-a")]


def test_sqlite_vec_runs_in_a_read_only_connection_closed_with_the_store(tmp_path: Path) -> None:
    async def body() -> None:
        store, keys = await _filled(tmp_path / "respd.sqlite3")
        assert (await store.sqlite_vec_version() or "").startswith("v0.")
        assert await store.nearest_chunks(keys, QUERIES["north"], 2) is not None
        reader = store._vector_reader
        assert reader is not None
        conn: Any = reader._conn
        distance = conn.execute(
            "SELECT vec_distance_cosine(?, ?)", (pack([1, 0]), pack([0, 1]))
        ).fetchone()[0]
        assert distance == pytest.approx(1.0)
        with pytest.raises(Exception, match="readonly"):
            conn.execute("DELETE FROM vector_chunks")
        await store.close()
        with pytest.raises(Exception, match="closed"):
            conn.execute("SELECT 1")
        assert await store.nearest_chunks(keys, QUERIES["north"], 2) is None

    asyncio.run(body())


@pytest.mark.parametrize("with_sqlean", [True, False])
def test_hybrid_search_ranks_alike_in_sqlite_vec_and_in_numpy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    with_sqlean: bool,
) -> None:
    if not with_sqlean:
        monkeypatch.setitem(sys.modules, "sqlean", None)  # `import sqlean` fails
    scans: list[int] = []
    numpy_ranking = search.cosine_ranking

    def counted(rows: list[tuple[int, bytes]], query: list[float], limit: int) -> list[int]:
        scans.append(len(rows))
        return numpy_ranking(rows, query, limit)

    monkeypatch.setattr(search, "cosine_ranking", counted)

    async def body() -> None:
        store, keys = await _filled(tmp_path / "respd.sqlite3")
        reads: list[list[str]] = []
        chunk_vectors = store.chunk_vectors

        async def read(keys: list[str]) -> list[tuple[int, bytes]]:
            reads.append(keys)
            return await chunk_vectors(keys)

        monkeypatch.setattr(store, "chunk_vectors", read)
        try:
            embedder = TableEmbedder()
            for query, expected in (
                (["north"], ["alpha", "beta", "gamma", "delta"]),
                (["east"], ["gamma", "beta", "alpha", "delta"]),
            ):
                hits = await search.hybrid_search(store, embedder, keys, query, 10)
                assert [h.chunk.text for h in hits] == expected
                assert hits[0].score == 0.5  # first of two rankings: the words found nothing
            both = await search.hybrid_search(store, embedder, keys, ["north", "east"], 2)
            # 1st and 3rd (alpha, gamma; tied, so by id) before beta's 2nd and 2nd.
            assert [h.chunk.text for h in both] == ["alpha", "gamma"]
            version = await store.sqlite_vec_version()
        finally:
            await store.close()
        if with_sqlean:
            assert version is not None and scans == [] and reads == []
        else:
            assert version is None
            assert scans == [5, 5, 5, 5]  # every vector read, the other width included
            assert len(reads) == 3  # once per search, not once per query

    with caplog.at_level(logging.WARNING, logger="respd.store.vectors.nearest"):
        asyncio.run(body())
    warnings = [r for r in caplog.records if "sqlite-vec" in r.getMessage()]
    assert len(warnings) == (0 if with_sqlean else 1)
