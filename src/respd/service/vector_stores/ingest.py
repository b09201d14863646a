"""Ingestion in the background: a file attached to a vector store is read from the Files
store, its text extracted (the document readers model input uses: text, code, PDF),
chunked, embedded when an embedding model is configured, and indexed; the file ends
`completed`, or `failed` with its `last_error`.

Each file is one asyncio task, at most `concurrency` at a time; text extraction and
chunking run in a worker thread. The store writes the chunks and the final status in one
transaction, and only while that attachment is still in progress: a file deleted,
cancelled or attached again mid-ingestion keeps no chunks of the stale run. Closing
cancels the tasks; files they leave `in_progress` are resumed by the next `resume()`
(the next start)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from respd.engines.embedding import Embedder, EmbeddingFailed, InputTooLong, TokenOutOfRange
from respd.protocol.errors import APIError
from respd.service.media.documents import document_text
from respd.service.vector_stores.chunking import chunk_text
from respd.service.vector_stores.fusion import pack
from respd.store.base import Store
from respd.store.vectors.records import JSON, Chunk, VectorFileRecord, file_key

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 2
EMBED_BATCH = 16
MAX_RETRIES = 12  # cuts of a batch whose texts are too long for the embedder
CUT_MARGIN = 0.9


class IngestFailed(Exception):
    """A file that cannot be indexed; `code` is one of `LastError`'s."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _chunks(content: bytes, mime: str, filename: str, chunking: JSON) -> list[str]:
    try:
        text = document_text(content, mime, filename, "file_id").text
    except APIError as exc:
        code = "unsupported_file" if exc.code == "unsupported_file_type" else "invalid_file"
        raise IngestFailed(code, exc.message) from None
    static = chunking["static"]
    return chunk_text(text, static["max_chunk_size_tokens"], static["chunk_overlap_tokens"])


async def embed_texts(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """One vector per text; texts longer than the embedder reads are embedded by their
    leading part that fits (their opening words say most about them). A refusal names one
    text and its token count: every text as long is cut to the share of it that would fit,
    with a margin, and the batch is tried again."""
    pending = list(texts)
    for _ in range(MAX_RETRIES):
        try:
            return (await embedder.embed(list(pending))).vectors
        except InputTooLong as exc:
            long = pending[exc.index]
            share = exc.limit / max(exc.n_tokens, 1) * CUT_MARGIN
            keep = min(max(1, int(len(long) * share)), len(long) - 1)
            pending = [text[:keep] for text in pending]
    raise IngestFailed("server_error", "a chunk is too long for the embedding model")


class Ingestor:
    def __init__(
        self, store: Store, embedder: Embedder | None, concurrency: int = DEFAULT_CONCURRENCY
    ) -> None:
        self.store = store
        self.embedder = embedder
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, record: VectorFileRecord) -> None:
        key = file_key(record.vector_store_id, record.file_id)
        previous = self._tasks.pop(key, None)
        if previous is not None:
            previous.cancel()  # attached again: the store drops the stale run's result anyway
        task = asyncio.create_task(self._run(record), name=f"ingest {key}")
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]

    def stop(self, store_id: str, file_id: str) -> None:
        """Cancel a file's ingestion, if it is running here."""
        task = self._tasks.pop(file_key(store_id, file_id), None)
        if task is not None:
            task.cancel()

    async def resume(self) -> None:
        for record in await self.store.pending_vector_files():
            self.start(record)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait(self) -> None:
        """Until every ingestion started so far has ended (for tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _run(self, record: VectorFileRecord) -> None:
        async with self._slots:
            error: JSON | None = None
            chunks: list[Chunk] = []
            try:
                chunks = await self._index(record)
            except IngestFailed as exc:
                error = {"code": exc.code, "message": exc.message}
            except Exception:
                log.exception("indexing %s for %s failed", record.file_id, record.vector_store_id)
                error = {"code": "server_error", "message": "The file could not be indexed."}
            try:
                await self.store.finish_vector_file(record, chunks, error)
            except Exception:  # the store is failing: the file stays in progress, resumed later
                log.exception("recording the ingestion of %s failed", record.file_id)

    async def _index(self, record: VectorFileRecord) -> list[Chunk]:
        owner = record.owner
        meta = await self.store.get_file(owner, record.file_id)
        content = await self.store.file_content(owner, record.file_id) if meta else None
        if meta is None or content is None:
            raise IngestFailed("invalid_file", f"The file '{record.file_id}' no longer exists.")
        texts = await asyncio.to_thread(
            _chunks, content, meta.mime_type, meta.filename, record.chunking
        )
        if self.embedder is None or not texts:
            return [Chunk(text) for text in texts]
        vectors: list[list[float]] = []
        try:
            for i in range(0, len(texts), EMBED_BATCH):
                vectors += await embed_texts(self.embedder, texts[i : i + EMBED_BATCH])
        except (EmbeddingFailed, TokenOutOfRange) as exc:
            raise IngestFailed("server_error", f"Embedding the file failed: {exc}") from None
        return [Chunk(text, pack(v)) for text, v in zip(texts, vectors, strict=True)]
