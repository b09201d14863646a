"""The vector store methods of `MemoryStore`: plain maps (not bounded by the memory
store's limits: a vector store's chunks go when it or its files are deleted or it
expires), and BM25 over the chunks' words computed in Python."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from respd.store.vectors.records import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    JSON,
    Chunk,
    ChunkHit,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
    file_counts,
    file_key,
)

BM25_K1 = 1.2
BM25_B = 0.75


@dataclass
class _Stored:
    record: VectorStoreRecord
    files: dict[str, VectorFileRecord] = field(default_factory=dict)  # insertion-ordered
    batches: dict[str, FileBatchRecord] = field(default_factory=dict)


@dataclass
class _StoredChunk:
    id: int
    vector_store_id: str
    file_id: str
    text: str
    embedding: bytes | None
    words: Counter[str]


@dataclass
class _VectorState:
    stores: dict[str, _Stored] = field(default_factory=dict)
    chunks: dict[str, list[_StoredChunk]] = field(default_factory=dict)  # by file_key
    next_chunk: int = 1


def _words(text: str) -> Counter[str]:
    return Counter(re.findall(r"\w+", text.lower()))


def _bm25(terms: list[str], chunks: list[_StoredChunk]) -> list[tuple[float, _StoredChunk]]:
    """Okapi BM25 of each chunk holding a term, over `chunks` as the corpus."""
    if not chunks:
        return []
    average = sum(sum(c.words.values()) for c in chunks) / len(chunks) or 1.0
    df = {t: sum(1 for c in chunks if t in c.words) for t in terms}
    scored = []
    for chunk in chunks:
        length = sum(chunk.words.values())
        score = 0.0
        for term in terms:
            tf = chunk.words.get(term, 0)
            if not tf:
                continue
            idf = math.log(1 + (len(chunks) - df[term] + 0.5) / (df[term] + 0.5))
            norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * length / average)
            score += idf * tf * (BM25_K1 + 1) / norm
        if score > 0:
            scored.append((score, chunk))
    return scored


class MemoryVectors:
    """Mixed into `MemoryStore`; `wall_clock` is compared with stores' `expires_at`."""

    wall_clock: Callable[[], float]
    _vector_state: _VectorState | None = None

    @property
    def _vectors(self) -> _VectorState:
        if self._vector_state is None:
            self._vector_state = _VectorState()
        return self._vector_state

    def _owned_store(self, owner: str, store_id: str) -> _Stored | None:
        stored = self._vectors.stores.get(store_id)
        return stored if stored is not None and stored.record.owner == owner else None

    def _add(
        self, stored: _Stored, files: list[VectorFileRecord], batch: FileBatchRecord | None
    ) -> None:
        if batch is not None:
            stored.batches[batch.id] = replace(batch)
        for record in files:
            self._vectors.chunks.pop(file_key(record.vector_store_id, record.file_id), None)
            stored.files.pop(record.file_id, None)  # attached again: last in the order
            stored.files[record.file_id] = replace(record)

    def _read(self, stored: _Stored) -> VectorStoreRecord:
        files = list(stored.files.values())
        return replace(
            stored.record,
            file_counts=file_counts([f.status for f in files]),
            usage_bytes=sum(f.usage_bytes for f in files),
        )

    async def put_vector_store(
        self,
        record: VectorStoreRecord,
        files: list[VectorFileRecord] | None = None,
        batch: FileBatchRecord | None = None,
    ) -> None:
        stored = self._vectors.stores.get(record.id)
        if stored is None:
            stored = self._vectors.stores[record.id] = _Stored(replace(record))
        elif stored.record.owner == record.owner:
            stored.record = replace(record)
        self._add(stored, files or [], batch)

    async def get_vector_store(self, owner: str, store_id: str) -> VectorStoreRecord | None:
        stored = self._owned_store(owner, store_id)
        return self._read(stored) if stored is not None else None

    async def list_vector_stores(self, owner: str) -> list[VectorStoreRecord]:
        mine = [s for s in self._vectors.stores.values() if s.record.owner == owner]
        return [self._read(s) for s in sorted(mine, key=lambda s: s.record.created_at)]

    def _drop(self, store_id: str) -> None:
        stored = self._vectors.stores.pop(store_id)
        for file_id in stored.files:
            self._vectors.chunks.pop(file_key(store_id, file_id), None)

    async def delete_vector_store(self, owner: str, store_id: str) -> bool:
        if self._owned_store(owner, store_id) is None:
            return False
        self._drop(store_id)
        return True

    async def add_vector_files(
        self,
        owner: str,
        store_id: str,
        files: list[VectorFileRecord],
        batch: FileBatchRecord | None = None,
    ) -> bool:
        stored = self._owned_store(owner, store_id)
        if stored is None:
            return False
        self._add(stored, files, batch)
        return True

    async def list_vector_files(self, owner: str, store_id: str) -> list[VectorFileRecord]:
        stored = self._owned_store(owner, store_id)
        files = list(stored.files.values()) if stored is not None else []
        return [replace(f) for f in sorted(files, key=lambda f: f.created_at)]

    async def update_vector_file(
        self, owner: str, store_id: str, file_id: str, attributes: JSON
    ) -> VectorFileRecord | None:
        stored = self._owned_store(owner, store_id)
        record = stored.files.get(file_id) if stored is not None else None
        if record is None:
            return None
        record.attributes = dict(attributes)
        return replace(record)

    async def delete_vector_file(self, owner: str, store_id: str, file_id: str) -> bool:
        stored = self._owned_store(owner, store_id)
        if stored is None or stored.files.pop(file_id, None) is None:
            return False
        self._vectors.chunks.pop(file_key(store_id, file_id), None)
        return True

    async def finish_vector_file(
        self, record: VectorFileRecord, chunks: list[Chunk], error: JSON | None = None
    ) -> bool:
        stored = self._vectors.stores.get(record.vector_store_id)
        current = stored.files.get(record.file_id) if stored is not None else None
        if (
            current is None
            or current.status != IN_PROGRESS
            or current.created_at != record.created_at
        ):
            return False
        current.status = FAILED if error is not None else COMPLETED
        current.last_error = error
        current.usage_bytes = sum(len(c.text.encode()) + len(c.embedding or b"") for c in chunks)
        made = []
        for chunk in chunks:
            state = self._vectors
            made.append(
                _StoredChunk(
                    state.next_chunk,
                    record.vector_store_id,
                    record.file_id,
                    chunk.text,
                    chunk.embedding,
                    _words(chunk.text),
                )
            )
            state.next_chunk += 1
        self._vectors.chunks[file_key(record.vector_store_id, record.file_id)] = made
        return True

    async def vector_file_chunks(self, owner: str, store_id: str, file_id: str) -> list[str]:
        if self._owned_store(owner, store_id) is None:
            return []
        return [c.text for c in self._vectors.chunks.get(file_key(store_id, file_id), [])]

    async def pending_vector_files(self) -> list[VectorFileRecord]:
        return [
            replace(f)
            for s in self._vectors.stores.values()
            for f in s.files.values()
            if f.status == IN_PROGRESS
        ]

    async def get_file_batch(
        self, owner: str, store_id: str, batch_id: str
    ) -> FileBatchRecord | None:
        stored = self._owned_store(owner, store_id)
        batch = stored.batches.get(batch_id) if stored is not None else None
        return replace(batch) if batch is not None else None

    async def cancel_file_batch(self, owner: str, store_id: str, batch_id: str) -> bool:
        stored = self._owned_store(owner, store_id)
        batch = stored.batches.get(batch_id) if stored is not None else None
        if stored is None or batch is None:
            return False
        batch.cancelled = True
        for record in stored.files.values():
            if record.batch_id == batch_id and record.status == IN_PROGRESS:
                record.status = "cancelled"
        return True

    def _chunks_of(self, keys: list[str]) -> list[_StoredChunk]:
        return [c for key in keys for c in self._vectors.chunks.get(key, [])]

    async def lexical_chunks(self, keys: list[str], terms: list[str], limit: int) -> list[ChunkHit]:
        scored = _bm25(terms, self._chunks_of(keys))
        scored.sort(key=lambda sc: (-sc[0], sc[1].id))
        return [
            ChunkHit(c.id, c.vector_store_id, c.file_id, c.text, score)
            for score, c in scored[:limit]
        ]

    async def chunk_vectors(self, keys: list[str]) -> list[tuple[int, bytes]]:
        return [(c.id, c.embedding) for c in self._chunks_of(keys) if c.embedding is not None]

    async def nearest_chunks(
        self, keys: list[str], vector: list[float], limit: int
    ) -> list[int] | None:
        return None  # the vectors are in this process already: the service ranks them

    async def chunks_by_id(self, ids: list[int]) -> list[ChunkHit]:
        wanted = set(ids)
        return [
            ChunkHit(c.id, c.vector_store_id, c.file_id, c.text)
            for chunks in self._vectors.chunks.values()
            for c in chunks
            if c.id in wanted
        ]

    def _purge_vector_stores(self) -> int:
        now = self.wall_clock()
        expired = [
            sid
            for sid, s in self._vectors.stores.items()
            if s.record.expires_at is not None and s.record.expires_at <= now
        ]
        for store_id in expired:
            self._drop(store_id)
        return len(expired)

    def _vector_bytes(self, owner: str) -> int:
        return sum(
            f.usage_bytes
            for s in self._vectors.stores.values()
            if s.record.owner == owner
            for f in s.files.values()
        )
