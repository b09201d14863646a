"""Ingestion in the background, at the service: what a shutdown, a deleted file, a long
chunk or a failing embedder leaves behind."""

from __future__ import annotations

import asyncio
import math

from respd.engines.embedding import EmbeddingFailed, EmbeddingInput, Embeddings
from respd.engines.fake import FakeEmbedder
from respd.service.vector_stores.service import VectorStores
from respd.store import FileRecord, MemoryStore
from respd.store.vectors.records import file_key

OWNER = "alice"


class GatedEmbedder(FakeEmbedder):
    """Embeds once `gate` is set; counts the calls that started."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__("gated", width=16, max_tokens=None)  # type: ignore[arg-type]
        self.gate = asyncio.Event()
        self.started = 0
        self.fail = fail

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        self.started += 1
        await self.gate.wait()
        if self.fail:
            raise EmbeddingFailed("the embedding server is down", 502)
        return await super().embed(inputs)


async def _upload(store: MemoryStore, file_id: str, text: str) -> None:
    record = FileRecord(file_id, OWNER, 1, f"{file_id}.txt", "assistants", len(text), "text/plain")
    await store.save_file(record, text.encode())


async def _started(embedder: GatedEmbedder, calls: int = 1) -> None:
    while embedder.started < calls:
        await asyncio.sleep(0.01)


async def test_shutdown_cancels_and_the_next_start_resumes() -> None:
    store = MemoryStore()
    await _upload(store, "file-1", "the text to index")
    embedder = GatedEmbedder()
    first = VectorStores(store, embedder)
    made = await first.create(OWNER, file_ids=["file-1"])
    await _started(embedder)
    await first.close()  # cancelled mid-embedding: nothing written
    (f,) = await store.list_vector_files(OWNER, made["id"])
    assert f.status == "in_progress" and f.usage_bytes == 0
    embedder.gate.set()
    second = VectorStores(store, embedder)
    await second.open()
    await second.ingestor.wait()
    (f,) = await store.list_vector_files(OWNER, made["id"])
    assert f.status == "completed"
    hits = await second.search(OWNER, [made["id"]], "index")
    assert [h.text for h in hits] == ["the text to index"]
    await second.close()


async def test_a_file_deleted_before_it_is_read_fails_and_one_detached_leaves_nothing() -> None:
    store = MemoryStore()
    await _upload(store, "file-1", "first words")
    await _upload(store, "file-2", "second words")
    embedder = GatedEmbedder()
    service = VectorStores(store, embedder, concurrency=1)
    made = await service.create(OWNER, file_ids=["file-1", "file-2"])
    await _started(embedder)  # file-1 is being embedded; file-2 waits for the slot
    assert await store.delete_file(OWNER, "file-2")
    await service.delete_file(OWNER, made["id"], "file-1")
    embedder.gate.set()
    await service.ingestor.wait()
    (f,) = await store.list_vector_files(OWNER, made["id"])
    assert f.file_id == "file-2" and f.status == "failed"
    assert f.last_error is not None and f.last_error["code"] == "invalid_file"
    assert await store.chunk_vectors([file_key(made["id"], "file-1")]) == []
    assert (await service.retrieve(OWNER, made["id"]))["usage_bytes"] == 0


async def test_a_failing_embedder_fails_the_file_and_search_falls_back_to_words() -> None:
    store = MemoryStore()
    await _upload(store, "file-1", "lighthouse notes")
    embedder = GatedEmbedder(fail=True)
    embedder.gate.set()
    service = VectorStores(store, embedder)
    made = await service.create(OWNER, file_ids=["file-1"])
    await service.ingestor.wait()
    (f,) = await store.list_vector_files(OWNER, made["id"])
    assert f.status == "failed" and f.last_error is not None
    assert f.last_error["code"] == "server_error" and "down" in f.last_error["message"]
    plain = VectorStores(store)  # the same store, searched without a model
    await plain.create_file(OWNER, made["id"], "file-1")
    await plain.ingestor.wait()
    failing = await service.search(OWNER, [made["id"]], "lighthouse")
    assert [h.file_id for h in failing] == ["file-1"]  # the query's vector failed: words only


async def test_chunks_longer_than_the_embedder_reads_are_embedded_by_their_start() -> None:
    store = MemoryStore()
    await _upload(store, "file-1", " ".join(f"word{i}" for i in range(2000)))
    embedder = FakeEmbedder("short", width=16, max_tokens=300)  # characters, 800-token chunks
    service = VectorStores(store, embedder)
    made = await service.create(OWNER, file_ids=["file-1"])
    await service.ingestor.wait()
    (f,) = await store.list_vector_files(OWNER, made["id"])
    assert f.status == "completed"
    rows = await store.chunk_vectors([file_key(made["id"], "file-1")])
    texts = await store.vector_file_chunks(OWNER, made["id"], "file-1")
    assert len(rows) == len(texts) > 1 and all(len(blob) == 16 * 4 for _, blob in rows)
    # One refusal, then the whole batch cut to fit at once: two calls per batch of 16.
    assert len(embedder.calls) == 2 * math.ceil(len(texts) / 16)
    assert all(len(i) <= 300 for i in embedder.calls[-1])
