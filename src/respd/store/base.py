"""The store protocol: what the service layer may persist and read back.

Records are plain JSON-able data (the wire shapes of responses and items), so every
implementation stores the same thing and `store/` knows nothing of Responses semantics.
Every record carries its `owner`, and every read takes one: a record is invisible to any
other identity.

Retention: a response (with its input items and event log) and a conversation (with its
items) expire a TTL after their last write. An expired record is invisible to every read at
once; `purge_expired` deletes the rows later, off the request path.

Background jobs: the process that runs a job holds a *lease* on it, as `worker`, and renews
it while the job runs. Several processes may share one store (PostgreSQL), so a job is
claimed by exactly one worker, a job whose lease ran out is found and failed by another, a
cancel request is a flag that the holder polls, and followers read the event log that the
holder flushes. Single-process stores (memory, sqlite) implement the same methods; there,
a job held by any other worker id belongs to a process that is gone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from respd.store.vectors.records import (
    Chunk,
    ChunkHit,
    FileBatchRecord,
    VectorFileRecord,
    VectorStoreRecord,
)

JSON = dict[str, Any]

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
UNFINISHED_STATUSES = frozenset({"queued", "in_progress"})

# Defaults of the settings that reach the stores (config/store.py reads them from here).
DEFAULT_TTL_SECS = 30 * 24 * 3600  # OpenAI keeps stored responses for 30 days
DEFAULT_PURGE_INTERVAL_SECS = 300.0
DEFAULT_JOB_LEASE_SECS = 30.0

STAT_KEYS = ("responses", "conversations", "items", "files", "file_bytes", "events")


@dataclass
class ResponseRecord:
    """A stored response: the Response object plus what chaining and listing need."""

    id: str
    owner: str
    created_at: int
    status: str
    background: bool
    response: JSON  # the Response object, as sent on the wire
    input_items: list[JSON] = field(default_factory=list)  # normalised, each with an `id`
    previous_response_id: str | None = None
    conversation_id: str | None = None

    @property
    def output(self) -> list[JSON]:
        return list(self.response.get("output") or [])

    def approx_bytes(self) -> int:
        return len(json.dumps(self.response)) + len(json.dumps(self.input_items)) + 256


@dataclass
class ConversationRecord:
    id: str
    owner: str
    created_at: int
    metadata: dict[str, str] = field(default_factory=dict)

    def as_object(self) -> JSON:
        return {
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": dict(self.metadata),
        }


@dataclass
class FileRecord:
    """An uploaded file (`POST /v1/files`); its bytes are kept beside it in the store."""

    id: str  # file-...
    owner: str
    created_at: int
    filename: str
    purpose: str
    bytes: int
    mime_type: str  # e.g. application/pdf, text/plain; from the upload, else guessed
    expires_at: int | None = None

    def as_object(self) -> JSON:
        """The OpenAI `FileObject`."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }


class Store(Protocol):
    """Persistence for responses, conversations, files and background jobs.

    Each write is atomic: a crash mid-write leaves the previous state, never half a record.
    Reads return `None` (or `False`) for ids that are unknown, expired *or owned by someone
    else*.
    """

    async def open(self) -> None:
        """Connect and bring the schema up to date; called once, inside the event loop."""
        ...

    async def close(self) -> None: ...

    # -- responses --------------------------------------------------------------------------

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
        worker: str | None = None,
    ) -> bool:
        """Insert or replace `record` (a finished record is never replaced by an unfinished
        one); in the same transaction append `conversation=(id, items)` to that conversation
        (skipped if it is gone) and `events` to its event log.

        With `worker`, this is the write of a running job by its holder: it only updates a
        record that `worker` still holds, and returns False, writing nothing, when the job
        was deleted, expired or taken over. Otherwise it returns True."""
        ...

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None: ...

    async def delete_response(self, owner: str, response_id: str) -> bool:
        """Delete a response and its event log."""
        ...

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        """Recorded stream events with `sequence_number > after`, in order."""
        ...

    # -- background jobs ----------------------------------------------------------------------

    async def start_job(self, record: ResponseRecord, worker: str, lease_secs: float) -> None:
        """Insert a new, unfinished background response, held by `worker` for `lease_secs`."""
        ...

    async def renew_leases(
        self, worker: str, response_ids: list[str], lease_secs: float
    ) -> list[str]:
        """Extend `worker`'s leases on these jobs; returns the ids it no longer holds
        (deleted, expired, finished or taken over by another worker)."""
        ...

    async def claim_job(
        self, response_id: str, worker: str, lease_secs: float
    ) -> ResponseRecord | None:
        """Take over one unfinished job whose holder is gone (its lease ran out); exactly one
        of several concurrent callers gets the record, the others None."""
        ...

    async def claim_stale_jobs(self, worker: str, lease_secs: float) -> list[ResponseRecord]:
        """Take over every unfinished job whose holder is gone, for `worker`, so that it can
        record them as failed; a job is handed to exactly one caller."""
        ...

    async def request_cancel(self, owner: str, response_id: str) -> bool:
        """Flag an unfinished job for cancellation, for its holder to notice; False when
        unknown, another owner's, or already finished."""
        ...

    async def cancel_requests(self, worker: str) -> list[str]:
        """The unfinished jobs `worker` holds that someone asked to cancel."""
        ...

    # -- conversations ------------------------------------------------------------------------

    async def create_conversation(self, record: ConversationRecord, items: list[JSON]) -> None: ...

    async def get_conversation(
        self, owner: str, conversation_id: str
    ) -> ConversationRecord | None: ...

    async def update_conversation(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> ConversationRecord | None: ...

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool: ...

    async def add_conversation_items(
        self, owner: str, conversation_id: str, items: list[JSON]
    ) -> bool:
        """Append items; False when the conversation does not exist."""
        ...

    async def conversation_items(self, owner: str, conversation_id: str) -> list[JSON] | None:
        """All items in insertion order; None when the conversation does not exist."""
        ...

    async def delete_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> bool: ...

    # -- files --------------------------------------------------------------------------------

    async def save_file(self, record: FileRecord, content: bytes) -> None:
        """Insert a file and its bytes in one write."""
        ...

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        """None when unknown, owned by someone else, or past `expires_at`."""
        ...

    async def file_content(self, owner: str, file_id: str) -> bytes | None: ...

    async def list_files(self, owner: str) -> list[FileRecord]:
        """The owner's unexpired files, oldest first."""
        ...

    async def delete_file(self, owner: str, file_id: str) -> bool: ...

    # -- vector stores --------------------------------------------------------------------
    # Records are in `store/vectors/records.py`. A store's files, batches and chunks go with
    # it; a file's chunks go with it, and attaching a file again drops its old chunks.

    async def put_vector_store(
        self,
        record: VectorStoreRecord,
        files: list[VectorFileRecord] | None = None,
        batch: FileBatchRecord | None = None,
    ) -> None:
        """Insert a vector store, or update its own fields (never its owner), with `files`
        and `batch` attached in the same write."""
        ...

    async def get_vector_store(self, owner: str, store_id: str) -> VectorStoreRecord | None:
        """The store with its files' counts and usage bytes (expired ones too, until
        purged)."""
        ...

    async def list_vector_stores(self, owner: str) -> list[VectorStoreRecord]:
        """The owner's stores, oldest first, with counts."""
        ...

    async def delete_vector_store(self, owner: str, store_id: str) -> bool: ...

    async def add_vector_files(
        self,
        owner: str,
        store_id: str,
        files: list[VectorFileRecord],
        batch: FileBatchRecord | None = None,
    ) -> bool:
        """Attach files (and their batch) in one write; False when the store is gone."""
        ...

    async def list_vector_files(self, owner: str, store_id: str) -> list[VectorFileRecord]:
        """The store's files, in the order they were attached; [] for a foreign store."""
        ...

    async def update_vector_file(
        self, owner: str, store_id: str, file_id: str, attributes: JSON
    ) -> VectorFileRecord | None: ...

    async def delete_vector_file(self, owner: str, store_id: str, file_id: str) -> bool: ...

    async def finish_vector_file(
        self, record: VectorFileRecord, chunks: list[Chunk], error: JSON | None = None
    ) -> bool:
        """End an ingestion: store `chunks` and mark the file completed (or failed with
        `error`, and no chunks) in one write, only if that same attachment is still in
        progress (not cancelled, deleted or attached again); False, writing nothing,
        otherwise."""
        ...

    async def vector_file_chunks(self, owner: str, store_id: str, file_id: str) -> list[str]:
        """The text of a file's chunks, in order."""
        ...

    async def pending_vector_files(self) -> list[VectorFileRecord]:
        """Every owner's files still in progress (to resume them after a restart)."""
        ...

    async def get_file_batch(
        self, owner: str, store_id: str, batch_id: str
    ) -> FileBatchRecord | None: ...

    async def cancel_file_batch(self, owner: str, store_id: str, batch_id: str) -> bool:
        """Mark the batch cancelled, and its files still in progress cancelled."""
        ...

    async def lexical_chunks(self, keys: list[str], terms: list[str], limit: int) -> list[ChunkHit]:
        """The best `limit` chunks of the files `keys` name (`file_key`) that hold any of
        `terms`, best first, by the database's own full-text ranking."""
        ...

    async def chunk_vectors(self, keys: list[str]) -> list[tuple[int, bytes]]:
        """(chunk id, float32 embedding) of every embedded chunk of these files."""
        ...

    async def nearest_chunks(
        self, keys: list[str], vector: list[float], limit: int
    ) -> list[int] | None:
        """The ids of the `limit` embedded chunks of these files most similar to `vector`
        (cosine), best first, ties by id, chunks of another width skipped: the service's
        numpy ranking of `chunk_vectors` (up to the float32 rounding of near-equal scores),
        done in the database. None when this store cannot rank there, and the caller ranks
        `chunk_vectors` itself."""
        ...

    async def chunks_by_id(self, ids: list[int]) -> list[ChunkHit]: ...

    # -- housekeeping -------------------------------------------------------------------------

    async def purge_expired(self) -> int:
        """Delete expired responses (with their events), conversations (with their items),
        files and vector stores (with their files and chunks); returns how many records
        went."""
        ...

    async def owner_bytes(self, owner: str) -> int:
        """Bytes `owner` keeps here: file contents, stored responses and vector store
        chunks (for the storage quota)."""
        ...

    async def stats(self) -> dict[str, int]:
        """What the store holds now (expired rows not yet purged included), keyed by
        `STAT_KEYS`: responses, conversations, conversation items, files, file bytes and
        stream events."""
        ...
