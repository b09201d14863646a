"""The vector store methods of `PostgresStore`: chunk text in a generated English
`tsvector` column (GIN-indexed) ranked by `ts_rank_cd`, vectors as float32 `bytea` read
back for an exact cosine scan by the service (pgvector is not assumed to be installed).
Files, batches and chunks cascade from their store."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from respd.store.sql import PURGE_BATCH, restyle
from respd.store.vectors.records import (
    COMPLETED,
    FAILED,
    JSON,
    Chunk,
    ChunkHit,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
)
from respd.store.vectors.sql import VPYFORMAT as Q
from respd.store.vectors.sql import (
    batch_record,
    batch_row,
    count_rows,
    file_record,
    file_row,
    store_record,
    store_row,
)

Conn = AsyncConnection[DictRow]

# The stores first, so that the (vector_store_id, file_id) index narrows the rows.
_KEYED = "c.vector_store_id = ANY(?) AND (c.vector_store_id || '/' || c.file_id) = ANY(?)"
# OR-ed words: each is `\w+`, so none is tsquery syntax; `to_tsquery` stems them as the
# column's `to_tsvector` did.
_LEXICAL = restyle(
    "SELECT c.id, c.vector_store_id, c.file_id, c.text, ts_rank_cd(c.tsv, q) AS score "
    "FROM vector_chunks c, to_tsquery('english', ?) q "
    f"WHERE c.tsv @@ q AND {_KEYED} ORDER BY score DESC, c.id LIMIT ?",
    "%s",
)
_VECTORS = restyle(
    f"SELECT c.id, c.embedding FROM vector_chunks c WHERE c.embedding IS NOT NULL AND {_KEYED}",
    "%s",
)
_BY_ID = "SELECT id, vector_store_id, file_id, text FROM vector_chunks WHERE id = ANY(%s)"
_PURGE = (
    "DELETE FROM vector_stores WHERE id IN (SELECT id FROM vector_stores WHERE expires_at "
    "IS NOT NULL AND expires_at <= %s LIMIT %s FOR UPDATE SKIP LOCKED)"
)


def _keyed(keys: list[str]) -> tuple[list[str], list[str]]:
    """The parameters of `_KEYED`: the stores of `keys`, then the keys."""
    return sorted({k.split("/", 1)[0] for k in keys}), keys


async def _add_files(
    conn: Conn, files: list[VectorFileRecord], batch: FileBatchRecord | None
) -> None:
    if batch is not None:
        await conn.execute(Q.insert_batch, batch_row(batch))
    for record in files:
        await conn.execute(
            "DELETE FROM vector_chunks WHERE vector_store_id = %s AND file_id = %s",
            (record.vector_store_id, record.file_id),
        )
        await conn.execute(Q.upsert_file, file_row(record))


class PostgresVectors:
    """Mixed into `PostgresStore`, whose `_connection` and `clock` these use."""

    clock: Callable[[], float]

    def _connection(self) -> AbstractAsyncContextManager[Conn]:
        raise NotImplementedError

    async def put_vector_store(
        self,
        record: VectorStoreRecord,
        files: list[VectorFileRecord] | None = None,
        batch: FileBatchRecord | None = None,
    ) -> None:
        async with self._connection() as conn:
            await conn.execute(Q.upsert_store, store_row(record))
            await _add_files(conn, files or [], batch)

    async def get_vector_store(self, owner: str, store_id: str) -> VectorStoreRecord | None:
        async with self._connection() as conn:
            row = await (await conn.execute(Q.get_store, (store_id, owner))).fetchone()
            if row is None:
                return None
            cur = await conn.execute(Q.store_counts, (owner, store_id))
            return store_record(row, count_rows(await cur.fetchall()))

    async def list_vector_stores(self, owner: str) -> list[VectorStoreRecord]:
        async with self._connection() as conn:
            counts = count_rows(await (await conn.execute(Q.counts, (owner,))).fetchall())
            rows = await (await conn.execute(Q.list_stores + "seq", (owner,))).fetchall()
        return [store_record(row, counts) for row in rows]

    async def delete_vector_store(self, owner: str, store_id: str) -> bool:
        async with self._connection() as conn:
            return (await conn.execute(Q.delete_store, (store_id, owner))).rowcount > 0

    async def add_vector_files(
        self,
        owner: str,
        store_id: str,
        files: list[VectorFileRecord],
        batch: FileBatchRecord | None = None,
    ) -> bool:
        async with self._connection() as conn:
            # FOR UPDATE: a concurrent delete of the store waits for these rows, or wins.
            cur = await conn.execute(Q.get_store + " FOR UPDATE", (store_id, owner))
            if await cur.fetchone() is None:
                return False
            await _add_files(conn, files, batch)
            return True

    async def list_vector_files(self, owner: str, store_id: str) -> list[VectorFileRecord]:
        async with self._connection() as conn:
            rows = await (await conn.execute(Q.list_files, (store_id, owner))).fetchall()
        return [file_record(r) for r in rows]

    async def update_vector_file(
        self, owner: str, store_id: str, file_id: str, attributes: JSON
    ) -> VectorFileRecord | None:
        params = (json.dumps(attributes), store_id, file_id, owner)
        async with self._connection() as conn:
            row = await (await conn.execute(Q.update_file, params)).fetchone()
        return file_record(row) if row else None

    async def delete_vector_file(self, owner: str, store_id: str, file_id: str) -> bool:
        async with self._connection() as conn:
            return (await conn.execute(Q.delete_file, (store_id, file_id, owner))).rowcount > 0

    async def finish_vector_file(
        self, record: VectorFileRecord, chunks: list[Chunk], error: JSON | None = None
    ) -> bool:
        size = sum(len(c.text.encode()) + len(c.embedding or b"") for c in chunks)
        status = FAILED if error is not None else COMPLETED
        last_error = json.dumps(error) if error is not None else None
        params = (status, last_error, size, record.vector_store_id, record.file_id)
        rows = [
            (record.vector_store_id, record.file_id, pos, chunk.text, chunk.embedding)
            for pos, chunk in enumerate(chunks)
        ]
        async with self._connection() as conn:
            cur = await conn.execute(Q.finish_file, (*params, record.created_at))
            if not cur.rowcount:
                return False
            if rows:
                async with conn.cursor() as many:
                    await many.executemany(Q.insert_chunk, rows)
            return True

    async def vector_file_chunks(self, owner: str, store_id: str, file_id: str) -> list[str]:
        async with self._connection() as conn:
            cur = await conn.execute(Q.file_chunks, (owner, store_id, file_id))
            return [r["text"] for r in await cur.fetchall()]

    async def pending_vector_files(self) -> list[VectorFileRecord]:
        async with self._connection() as conn:
            rows = await (await conn.execute(Q.pending_files)).fetchall()
        return [file_record(r) for r in rows]

    async def get_file_batch(
        self, owner: str, store_id: str, batch_id: str
    ) -> FileBatchRecord | None:
        async with self._connection() as conn:
            row = await (await conn.execute(Q.get_batch, (batch_id, store_id, owner))).fetchone()
        return batch_record(row) if row else None

    async def cancel_file_batch(self, owner: str, store_id: str, batch_id: str) -> bool:
        async with self._connection() as conn:
            if not (await conn.execute(Q.cancel_batch, (batch_id, store_id, owner))).rowcount:
                return False
            await conn.execute(Q.cancel_batch_files, (store_id, batch_id))
            return True

    async def lexical_chunks(self, keys: list[str], terms: list[str], limit: int) -> list[ChunkHit]:
        if not keys or not terms:
            return []
        async with self._connection() as conn:
            cur = await conn.execute(_LEXICAL, (" | ".join(terms), *_keyed(keys), limit))
            rows = await cur.fetchall()
        return [
            ChunkHit(r["id"], r["vector_store_id"], r["file_id"], r["text"], float(r["score"]))
            for r in rows
        ]

    async def chunk_vectors(self, keys: list[str]) -> list[tuple[int, bytes]]:
        if not keys:
            return []
        async with self._connection() as conn:
            rows = await (await conn.execute(_VECTORS, _keyed(keys))).fetchall()
        return [(r["id"], bytes(r["embedding"])) for r in rows]

    async def nearest_chunks(
        self, keys: list[str], vector: list[float], limit: int
    ) -> list[int] | None:
        return None  # pgvector is not assumed installed: the service scans `chunk_vectors`

    async def chunks_by_id(self, ids: list[int]) -> list[ChunkHit]:
        if not ids:
            return []
        async with self._connection() as conn:
            rows = await (await conn.execute(_BY_ID, (ids,))).fetchall()
        return [ChunkHit(r["id"], r["vector_store_id"], r["file_id"], r["text"]) for r in rows]

    async def _purge_vector_stores(self) -> int:
        total = 0
        while True:
            async with self._connection() as conn:
                cur = await conn.execute(_PURGE, (int(self.clock()), PURGE_BATCH))
            total += cur.rowcount
            if cur.rowcount < PURGE_BATCH:
                return total
