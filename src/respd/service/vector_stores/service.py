"""`VectorStores`: the Vector Stores API over the store, and the search the `file_search`
tool calls.

Every method takes the caller's `owner`: another identity's store, file or batch is a 404,
exactly as an unknown id. Attaching files checks every file first and writes the store,
its files and their batch in one store write, then starts their ingestion in the
background (`ingest.py`); a request never waits for indexing."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from respd.engines.embedding import Embedder
from respd.protocol.errors import InvalidRequest, NotFound
from respd.service.metadata import check_metadata
from respd.service.quotas import KeyQuotas
from respd.service.vector_stores.checks import (
    check_attributes,
    check_expires_after,
    check_max_results,
    check_queries,
    check_ranking,
)
from respd.service.vector_stores.chunking import check_strategy
from respd.service.vector_stores.filters import check_filter, matches
from respd.service.vector_stores.ingest import DEFAULT_CONCURRENCY, Ingestor
from respd.service.vector_stores.objects import (
    batch_object,
    cursor_page,
    expiry,
    file_object,
    search_page,
    store_object,
)
from respd.service.vector_stores.search import hybrid_search
from respd.store.base import Store
from respd.store.vectors.records import (
    COMPLETED,
    FILE_STATUSES,
    IN_PROGRESS,
    JSON,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
    file_key,
)

MAX_FILES_PER_REQUEST = 2000  # OpenAI's batch limit
# A search moves `last_active_at` (and so `expires_at`) at most this often: expiry counts
# days, and a write per search would race with modifications for nothing.
ACTIVITY_GRANULARITY_SECS = 60
_UNSET: Any = object()


@dataclass(frozen=True)
class SearchHit:
    """One chunk found by a search, with its file's name and attributes."""

    file_id: str
    filename: str
    score: float
    attributes: dict[str, Any]
    text: str


@dataclass(frozen=True)
class FileSpec:
    """One file to attach, as a request names it (checked by `VectorStores`)."""

    file_id: Any
    attributes: Any = None
    chunking_strategy: Any = None


def store_not_found(store_id: str, param: str = "vector_store_id") -> NotFound:
    return NotFound(f"No vector store found with id '{store_id}'.", param=param)


def _file_not_found(file_id: str, param: str) -> NotFound:
    return NotFound(f"No file found with id '{file_id}'.", param=param)


class VectorStores:
    def __init__(
        self,
        store: Store,
        embedder: Embedder | None = None,
        *,
        quotas: KeyQuotas | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.quotas = quotas
        self.clock = clock
        self.ingestor = Ingestor(store, embedder, concurrency)

    async def open(self) -> None:
        """Resume the ingestions a previous process left unfinished."""
        await self.ingestor.resume()

    async def close(self) -> None:
        await self.ingestor.close()

    # -- stores --------------------------------------------------------------------------

    async def _record(
        self, owner: str, store_id: str, param: str = "vector_store_id"
    ) -> VectorStoreRecord:
        record = await self.store.get_vector_store(owner, store_id)
        if record is None:
            raise store_not_found(store_id, param)
        return record

    async def create(
        self,
        owner: str,
        *,
        name: str | None = None,
        file_ids: list[str] | None = None,
        chunking_strategy: Any = None,
        metadata: dict[str, str] | None = None,
        expires_after: Any = None,
    ) -> JSON:
        check_metadata(metadata)
        check_strategy(chunking_strategy)  # checked even with no files to use it on
        after = check_expires_after(expires_after)
        now = int(self.clock())
        record = VectorStoreRecord(
            id=f"vs_{secrets.token_hex(12)}",
            owner=owner,
            created_at=now,
            name=name or "",
            metadata=dict(metadata or {}),
            expires_after=after,
            last_active_at=now,
            expires_at=expiry(after, now),
        )
        specs = [FileSpec(f, None, chunking_strategy) for f in file_ids or []]
        files = await self._new_files(owner, record.id, specs, "file_ids", None)
        await self.store.put_vector_store(record, files)
        self._ingest(files)
        return await self.retrieve(owner, record.id)

    async def list_stores(
        self,
        owner: str,
        *,
        limit: int | None = None,
        order: str | None = None,
        after: str | None = None,
        before: str | None = None,
    ) -> JSON:
        now = self.clock()
        records = await self.store.list_vector_stores(owner)
        items = [store_object(r, now) for r in records]
        return cursor_page(items, limit=limit, order=order, after=after, before=before)

    async def retrieve(self, owner: str, store_id: str) -> JSON:
        return store_object(await self._record(owner, store_id), self.clock())

    async def update(
        self,
        owner: str,
        store_id: str,
        *,
        name: str | None = _UNSET,
        metadata: dict[str, str] | None = _UNSET,
        expires_after: Any = _UNSET,
    ) -> JSON:
        record = await self._record(owner, store_id)
        if name is not _UNSET and name is not None:
            record.name = name
        if metadata is not _UNSET:
            check_metadata(metadata)
            record.metadata = dict(metadata or {})
        if expires_after is not _UNSET:
            record.expires_after = check_expires_after(expires_after)
        record.last_active_at = int(self.clock())
        record.expires_at = expiry(record.expires_after, record.last_active_at)
        await self.store.put_vector_store(record)
        return await self.retrieve(owner, store_id)

    async def delete(self, owner: str, store_id: str) -> JSON:
        files = await self.store.list_vector_files(owner, store_id)
        if not await self.store.delete_vector_store(owner, store_id):
            raise store_not_found(store_id)
        for f in files:
            self.ingestor.stop(store_id, f.file_id)
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    # -- files -----------------------------------------------------------------------------

    async def _new_files(
        self,
        owner: str,
        store_id: str,
        specs: list[FileSpec],
        param: str,
        batch_id: str | None,
    ) -> list[VectorFileRecord]:
        """Checked records of files to attach (nothing is written here)."""
        if len(specs) > MAX_FILES_PER_REQUEST:
            raise InvalidRequest(
                f"Invalid '{param}': at most {MAX_FILES_PER_REQUEST} files at once, got "
                f"{len(specs)}.",
                param=param,
                code="invalid_value",
            )
        now = int(self.clock())
        records: dict[str, VectorFileRecord] = {}
        size = 0
        for i, spec in enumerate(specs):
            where = f"{param}[{i}]" if param != "file_id" else param
            if not isinstance(spec.file_id, str) or not spec.file_id:
                raise InvalidRequest(
                    f"Invalid '{where}': expected a file id.", param=where, code="invalid_value"
                )
            # A batch's `files` carry their own options; elsewhere they are the request's.
            own = f"{where}." if param == "files" else ""
            chunking = check_strategy(spec.chunking_strategy, f"{own}chunking_strategy")
            attributes = check_attributes(spec.attributes, f"{own}attributes")
            meta = await self.store.get_file(owner, spec.file_id)
            if meta is None:
                raise _file_not_found(spec.file_id, where)
            size += meta.bytes
            records[spec.file_id] = VectorFileRecord(
                vector_store_id=store_id,
                file_id=spec.file_id,
                owner=owner,
                created_at=now,
                filename=meta.filename,
                attributes=attributes,
                chunking=chunking,
                batch_id=batch_id,
            )
        if self.quotas is not None and records:
            await self.quotas.check_storage(self.store, owner, size)
        return list(records.values())

    def _ingest(self, files: list[VectorFileRecord]) -> None:
        for record in files:
            self.ingestor.start(record)

    async def _files(self, owner: str, store_id: str) -> list[VectorFileRecord]:
        await self._record(owner, store_id)
        return await self.store.list_vector_files(owner, store_id)

    async def _file(self, owner: str, store_id: str, file_id: str) -> VectorFileRecord:
        for record in await self._files(owner, store_id):
            if record.file_id == file_id:
                return record
        raise _file_not_found(file_id, "file_id")

    async def create_file(
        self,
        owner: str,
        store_id: str,
        file_id: Any,
        *,
        attributes: Any = None,
        chunking_strategy: Any = None,
    ) -> JSON:
        await self._record(owner, store_id)
        spec = FileSpec(file_id, attributes, chunking_strategy)
        files = await self._new_files(owner, store_id, [spec], "file_id", None)
        if not await self.store.add_vector_files(owner, store_id, files):
            raise store_not_found(store_id)
        self._ingest(files)
        return file_object(files[0])

    async def list_files(
        self,
        owner: str,
        store_id: str,
        *,
        status: str | None = None,
        batch_id: str | None = None,
        limit: int | None = None,
        order: str | None = None,
        after: str | None = None,
        before: str | None = None,
    ) -> JSON:
        if status is not None and status not in FILE_STATUSES:
            raise InvalidRequest(
                f"Invalid 'filter': expected one of {', '.join(FILE_STATUSES)}, got {status!r}.",
                param="filter",
                code="invalid_value",
            )
        if batch_id is not None:
            await self._batch(owner, store_id, batch_id)
        files = await self._files(owner, store_id)
        items = [
            file_object(f)
            for f in files
            if (status is None or f.status == status)
            and (batch_id is None or f.batch_id == batch_id)
        ]
        return cursor_page(items, limit=limit, order=order, after=after, before=before)

    async def retrieve_file(self, owner: str, store_id: str, file_id: str) -> JSON:
        return file_object(await self._file(owner, store_id, file_id))

    async def update_file(self, owner: str, store_id: str, file_id: str, attributes: Any) -> JSON:
        checked = check_attributes(attributes)
        await self._record(owner, store_id)
        record = await self.store.update_vector_file(owner, store_id, file_id, checked)
        if record is None:
            raise _file_not_found(file_id, "file_id")
        return file_object(record)

    async def delete_file(self, owner: str, store_id: str, file_id: str) -> JSON:
        await self._record(owner, store_id)
        if not await self.store.delete_vector_file(owner, store_id, file_id):
            raise _file_not_found(file_id, "file_id")
        self.ingestor.stop(store_id, file_id)
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    async def file_content(self, owner: str, store_id: str, file_id: str) -> JSON:
        await self._file(owner, store_id, file_id)
        texts = await self.store.vector_file_chunks(owner, store_id, file_id)
        return {
            "object": "vector_store.file_content.page",
            "data": [{"type": "text", "text": text} for text in texts],
            "has_more": False,
            "next_page": None,
        }

    # -- batches ---------------------------------------------------------------------------

    async def _batch(self, owner: str, store_id: str, batch_id: str) -> FileBatchRecord:
        await self._record(owner, store_id)
        batch = await self.store.get_file_batch(owner, store_id, batch_id)
        if batch is None:
            raise NotFound(f"No file batch found with id '{batch_id}'.", param="batch_id")
        return batch

    async def _batch_object(self, owner: str, batch: FileBatchRecord) -> JSON:
        files = await self.store.list_vector_files(owner, batch.vector_store_id)
        return batch_object(batch, [f for f in files if f.batch_id == batch.id])

    async def create_batch(
        self,
        owner: str,
        store_id: str,
        *,
        file_ids: list[Any] | None = None,
        files: list[Any] | None = None,
        attributes: Any = None,
        chunking_strategy: Any = None,
    ) -> JSON:
        if (file_ids is None) == (files is None):
            raise InvalidRequest(
                "Give exactly one of 'file_ids' and 'files'.",
                param="file_ids",
                code="invalid_value",
            )
        await self._record(owner, store_id)
        if file_ids is not None:
            specs = [FileSpec(f, attributes, chunking_strategy) for f in file_ids]
            param = "file_ids"
        else:
            specs = [_spec(f, f"files[{i}]") for i, f in enumerate(files or [])]
            param = "files"
        if not specs:
            raise InvalidRequest(
                f"Invalid '{param}': expected at least one file.", param=param, code="invalid_value"
            )
        batch = FileBatchRecord(f"vsfb_{secrets.token_hex(12)}", store_id, owner, int(self.clock()))
        records = await self._new_files(owner, store_id, specs, param, batch.id)
        if not await self.store.add_vector_files(owner, store_id, records, batch):
            raise store_not_found(store_id)
        self._ingest(records)
        return batch_object(batch, records)

    async def retrieve_batch(self, owner: str, store_id: str, batch_id: str) -> JSON:
        return await self._batch_object(owner, await self._batch(owner, store_id, batch_id))

    async def cancel_batch(self, owner: str, store_id: str, batch_id: str) -> JSON:
        await self._batch(owner, store_id, batch_id)
        files = await self.store.list_vector_files(owner, store_id)
        mine = [f for f in files if f.batch_id == batch_id]
        if any(f.status == IN_PROGRESS for f in mine):
            await self.store.cancel_file_batch(owner, store_id, batch_id)
            for f in mine:
                self.ingestor.stop(store_id, f.file_id)
        return await self.retrieve_batch(owner, store_id, batch_id)

    # -- search ----------------------------------------------------------------------------

    async def search(
        self,
        owner: str,
        vector_store_ids: list[str],
        query: str | list[str],
        *,
        max_num_results: int = 10,
        filters: dict[str, Any] | None = None,
        ranking_options: dict[str, Any] | None = None,
    ) -> list[SearchHit]:
        """The chunks of the owner's stores that best answer `query`, best first: at most
        `max_num_results`, none scoring under `ranking_options.score_threshold`, only of
        files whose attributes pass `filters`. An unknown, foreign or expired store is a
        404 (400 when expired) naming `vector_store_ids`."""
        queries = check_queries(query)
        limit = check_max_results(max_num_results)
        threshold = check_ranking(ranking_options)
        flt = check_filter(filters) if filters is not None else None
        files: dict[str, VectorFileRecord] = {}
        for store_id in dict.fromkeys(vector_store_ids):
            searchable = await self._searchable(owner, store_id)
            for f in await self.store.list_vector_files(owner, searchable.id):
                if f.status == COMPLETED and matches(flt, f.attributes):
                    files[file_key(f.vector_store_id, f.file_id)] = f
        found = await hybrid_search(self.store, self.embedder, list(files), queries, limit)
        hits = []
        for scored in found:
            chunk = scored.chunk
            source = files.get(file_key(chunk.vector_store_id, chunk.file_id))
            if source is None or scored.score < threshold:
                continue
            hits.append(
                SearchHit(
                    file_id=source.file_id,
                    filename=source.filename,
                    score=scored.score,
                    attributes=dict(source.attributes),
                    text=chunk.text,
                )
            )
        return hits

    async def _searchable(self, owner: str, store_id: str) -> VectorStoreRecord:
        record = await self._record(owner, store_id, "vector_store_ids")
        now = self.clock()
        if record.expires_at is not None and record.expires_at <= now:
            raise InvalidRequest(
                f"The vector store '{store_id}' has expired.",
                param="vector_store_ids",
                code="vector_store_expired",
            )
        if now - record.last_active_at >= ACTIVITY_GRANULARITY_SECS:
            record.last_active_at = int(now)
            record.expires_at = expiry(record.expires_after, record.last_active_at)
            await self.store.put_vector_store(record)
        return record

    async def search_page(self, owner: str, store_id: str, query: Any, **options: Any) -> JSON:
        """`POST /v1/vector_stores/{id}/search`: the search results page."""
        await self._record(owner, store_id)
        hits = await self.search(owner, [store_id], query, **options)
        return search_page(
            query,
            [
                {
                    "file_id": h.file_id,
                    "filename": h.filename,
                    "score": h.score,
                    "attributes": h.attributes,
                    "content": [{"type": "text", "text": h.text}],
                }
                for h in hits
            ],
        )


def _spec(raw: Any, param: str) -> FileSpec:
    if not isinstance(raw, dict):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
        )
    return FileSpec(raw.get("file_id"), raw.get("attributes"), raw.get("chunking_strategy"))
