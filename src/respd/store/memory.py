"""In-memory store, bounded by entry count, approximate bytes and TTL (the --*-store-* flags).

Limits, per map (responses; conversations):
- `max_entries`: 0 disables the map (nothing is kept); otherwise the oldest write is evicted
  once there are more entries.
- `max_bytes`: approximate JSON bytes retained; 0 keeps the routes working but evicts every
  entry at once; otherwise the oldest writes are evicted until the total fits.
- `ttl_secs`: an entry expires that long after its last write; 0 disables expiry.
Uploaded files live in their own map, bounded by the bytes of their contents only
(`--files-store-max-bytes`, oldest evicted first; no entry count, no TTL: a file is kept
until it is deleted, evicted, or past its own `expires_at`).
Nothing survives a restart: use the sqlite store for that. Expired entries are dropped as
soon as any read or write of their map sees them (`purge_expired` sweeps every map).
"""

from __future__ import annotations

import json
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from respd.store.base import (
    JSON,
    STAT_KEYS,
    TERMINAL_STATUSES,
    ConversationRecord,
    FileRecord,
    ResponseRecord,
)
from respd.store.vectors.memory import MemoryVectors

V = TypeVar("V")


def _size(obj: object) -> int:
    return len(json.dumps(obj, ensure_ascii=False, default=str))


@dataclass
class Limits:
    max_entries: int
    max_bytes: int
    ttl_secs: float


@dataclass
class _Entry(Generic[V]):
    value: V
    size: int
    written_at: float


class BoundedMap(Generic[V]):
    """An insertion-ordered map that evicts by the `Limits` above; a write moves a key last."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._entries: OrderedDict[str, _Entry[V]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def _expire(self) -> int:
        ttl = self.limits.ttl_secs
        if ttl <= 0:
            return 0
        now = self.clock()
        expired = 0
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.written_at <= ttl:
                break
            self.pop(key)
            expired += 1
        return expired

    def purge(self) -> int:
        """Drop expired entries now; returns how many went."""
        return self._expire()

    def _evict(self) -> None:
        lim = self.limits
        while self._entries and (
            len(self._entries) > lim.max_entries or self.bytes > lim.max_bytes
        ):
            self.pop(next(iter(self._entries)))

    def put(self, key: str, value: V, size: int) -> None:
        self.pop(key)
        if self.limits.max_entries <= 0:
            return  # the map is disabled
        self._entries[key] = _Entry(value, size, self.clock())
        self.bytes += size
        self._expire()
        self._evict()

    def resize(self, key: str, size: int) -> None:
        """Account a grown value (e.g. items appended to a conversation) as a new write."""
        entry = self._entries.get(key)
        if entry is not None:
            self.put(key, entry.value, size)

    def get(self, key: str) -> V | None:
        self._expire()
        entry = self._entries.get(key)
        return entry.value if entry else None

    def size_of(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.size if entry else 0

    def pop(self, key: str) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.bytes -= entry.size
        return entry.value

    def values(self) -> list[V]:
        self._expire()
        return [e.value for e in self._entries.values()]


@dataclass
class _StoredResponse:
    record: ResponseRecord
    events: list[JSON] = field(default_factory=list)
    worker: str | None = None  # the job's lease (see base.py)
    lease_until: float = 0.0
    cancel_requested: bool = False


@dataclass
class _StoredConversation:
    record: ConversationRecord
    items: list[JSON] = field(default_factory=list)


@dataclass
class _StoredFile:
    record: FileRecord
    content: bytes


DEFAULT_FILES_MAX_BYTES = 1 << 30
# The memory store's default bounds: entries and approximate JSON bytes.
DEFAULT_RESPONSES_MAX_ENTRIES = 1024
DEFAULT_RESPONSES_MAX_BYTES = 256 << 20
DEFAULT_CONVERSATIONS_MAX_ENTRIES = 256
DEFAULT_CONVERSATIONS_MAX_BYTES = 64 << 20


def file_limits(max_bytes: int) -> Limits:
    """The files map's limits: bytes of content only, no entry cap, no TTL."""
    return Limits(max_entries=sys.maxsize, max_bytes=max_bytes, ttl_secs=0)


def _expired(record: FileRecord, now: float) -> bool:
    return record.expires_at is not None and record.expires_at <= now


class MemoryStore(MemoryVectors):
    def __init__(
        self,
        responses: Limits | None = None,
        conversations: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        files: Limits | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` measures TTLs; `wall_clock` is compared with files' `expires_at`."""
        self.responses: BoundedMap[_StoredResponse] = BoundedMap(
            responses or Limits(DEFAULT_RESPONSES_MAX_ENTRIES, DEFAULT_RESPONSES_MAX_BYTES, 0),
            clock,
        )
        self.conversations: BoundedMap[_StoredConversation] = BoundedMap(
            conversations
            or Limits(DEFAULT_CONVERSATIONS_MAX_ENTRIES, DEFAULT_CONVERSATIONS_MAX_BYTES, 0),
            clock,
        )
        self.files: BoundedMap[_StoredFile] = BoundedMap(
            files or file_limits(DEFAULT_FILES_MAX_BYTES), clock
        )
        self.clock = clock
        self.wall_clock = wall_clock

    async def open(self) -> None:
        return None

    # -- responses ------------------------------------------------------------------------

    def _response_size(self, stored: _StoredResponse) -> int:
        return stored.record.approx_bytes() + sum(_size(e) for e in stored.events)

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
        worker: str | None = None,
    ) -> bool:
        old = self.responses.get(record.id)
        if worker is not None and (
            old is None or old.worker != worker or old.record.status in TERMINAL_STATUSES
        ):
            return False  # deleted, expired, finished or taken over: the holder writes nothing
        if (
            old
            and old.record.status in TERMINAL_STATUSES
            and record.status not in TERMINAL_STATUSES
        ):
            record = old.record  # finished stays finished (see SqliteStore.save_response)
        stored = _StoredResponse(replace(record), list(old.events) if old else [])
        if old is not None:
            stored.worker, stored.lease_until = old.worker, old.lease_until
            stored.cancel_requested = old.cancel_requested
        stored.events = _merge_events(stored.events, events or [])
        self.responses.put(record.id, stored, self._response_size(stored))
        if conversation is not None:
            conv = self.conversations.get(conversation[0])
            if conv is not None and conv.record.owner == record.owner:
                self._append_items(conv, conversation[1])
        return True

    def _owned_response(self, owner: str, response_id: str) -> _StoredResponse | None:
        stored = self.responses.get(response_id)
        return stored if stored is not None and stored.record.owner == owner else None

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None:
        stored = self._owned_response(owner, response_id)
        return replace(stored.record) if stored else None

    async def delete_response(self, owner: str, response_id: str) -> bool:
        if self._owned_response(owner, response_id) is None:
            return False
        self.responses.pop(response_id)
        return True

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        stored = self._owned_response(owner, response_id)
        if stored is None:
            return []
        return [e for e in stored.events if e.get("sequence_number", -1) > after]

    # -- background jobs --------------------------------------------------------------------

    async def start_job(self, record: ResponseRecord, worker: str, lease_secs: float) -> None:
        stored = _StoredResponse(replace(record), [], worker, self.clock() + lease_secs)
        self.responses.put(record.id, stored, self._response_size(stored))

    def _held(self, worker: str, response_id: str) -> _StoredResponse | None:
        stored = self.responses.get(response_id)
        if stored is None or stored.worker != worker:
            return None
        return None if stored.record.status in TERMINAL_STATUSES else stored

    async def renew_leases(
        self, worker: str, response_ids: list[str], lease_secs: float
    ) -> list[str]:
        lost = []
        for rid in response_ids:
            stored = self._held(worker, rid)
            if stored is None:
                lost.append(rid)
            else:
                stored.lease_until = self.clock() + lease_secs
        return lost

    def _stale(self, stored: _StoredResponse, worker: str) -> bool:
        # One process owns this store: a job held by another worker id is a dead process's.
        return stored.record.status not in TERMINAL_STATUSES and (
            stored.worker != worker or stored.lease_until < self.clock()
        )

    def _claim(self, stored: _StoredResponse, worker: str, lease_secs: float) -> ResponseRecord:
        stored.worker, stored.lease_until = worker, self.clock() + lease_secs
        stored.cancel_requested = False
        return replace(stored.record)

    async def claim_job(
        self, response_id: str, worker: str, lease_secs: float
    ) -> ResponseRecord | None:
        stored = self.responses.get(response_id)
        if stored is None or not self._stale(stored, worker):
            return None
        return self._claim(stored, worker, lease_secs)

    async def claim_stale_jobs(self, worker: str, lease_secs: float) -> list[ResponseRecord]:
        return [
            self._claim(s, worker, lease_secs)
            for s in self.responses.values()
            if self._stale(s, worker)
        ]

    async def request_cancel(self, owner: str, response_id: str) -> bool:
        stored = self._owned_response(owner, response_id)
        if stored is None or stored.record.status in TERMINAL_STATUSES:
            return False
        stored.cancel_requested = True
        return True

    async def cancel_requests(self, worker: str) -> list[str]:
        return [
            s.record.id
            for s in self.responses.values()
            if s.worker == worker
            and s.cancel_requested
            and s.record.status not in TERMINAL_STATUSES
        ]

    # -- conversations --------------------------------------------------------------------

    def _conversation_size(self, conv: _StoredConversation) -> int:
        return _size(conv.record.as_object()) + sum(_size(i) for i in conv.items)

    def _append_items(self, conv: _StoredConversation, items: list[JSON]) -> None:
        conv.items.extend(items)
        self.conversations.resize(conv.record.id, self._conversation_size(conv))

    def _owned_conversation(self, owner: str, conversation_id: str) -> _StoredConversation | None:
        conv = self.conversations.get(conversation_id)
        return conv if conv is not None and conv.record.owner == owner else None

    async def create_conversation(self, record: ConversationRecord, items: list[JSON]) -> None:
        conv = _StoredConversation(replace(record), list(items))
        self.conversations.put(record.id, conv, self._conversation_size(conv))

    async def get_conversation(self, owner: str, conversation_id: str) -> ConversationRecord | None:
        conv = self._owned_conversation(owner, conversation_id)
        return replace(conv.record) if conv else None

    async def update_conversation(
        self, owner: str, conversation_id: str, metadata: dict[str, str]
    ) -> ConversationRecord | None:
        conv = self._owned_conversation(owner, conversation_id)
        if conv is None:
            return None
        conv.record.metadata = dict(metadata)
        self.conversations.resize(conversation_id, self._conversation_size(conv))
        return replace(conv.record)

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        if self._owned_conversation(owner, conversation_id) is None:
            return False
        self.conversations.pop(conversation_id)
        return True

    async def add_conversation_items(
        self, owner: str, conversation_id: str, items: list[JSON]
    ) -> bool:
        conv = self._owned_conversation(owner, conversation_id)
        if conv is None:
            return False
        self._append_items(conv, items)
        return True

    async def conversation_items(self, owner: str, conversation_id: str) -> list[JSON] | None:
        conv = self._owned_conversation(owner, conversation_id)
        return list(conv.items) if conv else None

    async def delete_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> bool:
        conv = self._owned_conversation(owner, conversation_id)
        if conv is None:
            return False
        kept = [i for i in conv.items if i.get("id") != item_id]
        if len(kept) == len(conv.items):
            return False
        conv.items = kept
        self.conversations.resize(conversation_id, self._conversation_size(conv))
        return True

    # -- files ----------------------------------------------------------------------------

    def _purge_expired_files(self) -> None:
        now = self.wall_clock()
        for stored in self.files.values():
            if _expired(stored.record, now):
                self.files.pop(stored.record.id)

    def _owned_file(self, owner: str, file_id: str) -> _StoredFile | None:
        stored = self.files.get(file_id)
        if stored is None or stored.record.owner != owner:
            return None
        if _expired(stored.record, self.wall_clock()):
            self.files.pop(file_id)  # invisible from now on; free its bytes too
            return None
        return stored

    async def save_file(self, record: FileRecord, content: bytes) -> None:
        self._purge_expired_files()  # expired bytes must not evict live files
        if _expired(record, self.wall_clock()):
            return  # invisible from the start
        self.files.put(record.id, _StoredFile(replace(record), bytes(content)), len(content))

    async def get_file(self, owner: str, file_id: str) -> FileRecord | None:
        stored = self._owned_file(owner, file_id)
        return replace(stored.record) if stored else None

    async def file_content(self, owner: str, file_id: str) -> bytes | None:
        stored = self._owned_file(owner, file_id)
        return stored.content if stored else None

    async def list_files(self, owner: str) -> list[FileRecord]:
        now = self.wall_clock()
        return [
            replace(s.record)
            for s in self.files.values()
            if s.record.owner == owner and not _expired(s.record, now)
        ]

    async def delete_file(self, owner: str, file_id: str) -> bool:
        if self._owned_file(owner, file_id) is None:
            return False
        self.files.pop(file_id)
        return True

    # -- housekeeping -----------------------------------------------------------------------

    async def purge_expired(self) -> int:
        before = len(self.files.values())
        self._purge_expired_files()
        files = before - len(self.files.values())
        vector_stores = self._purge_vector_stores()
        return self.responses.purge() + self.conversations.purge() + files + vector_stores

    async def owner_bytes(self, owner: str) -> int:
        files = sum(f.record.bytes for f in self.files.values() if f.record.owner == owner)
        files += self._vector_bytes(owner)
        return files + sum(
            self._response_size(r) for r in self.responses.values() if r.record.owner == owner
        )

    async def stats(self) -> dict[str, int]:
        responses = self.responses.values()
        conversations = self.conversations.values()
        files = self.files.values()
        counts = (
            len(responses),
            len(conversations),
            sum(len(c.items) for c in conversations),
            len(files),
            sum(f.record.bytes for f in files),
            sum(len(r.events) for r in responses),
        )
        return dict(zip(STAT_KEYS, counts, strict=True))

    async def close(self) -> None:
        return None


def _merge_events(log: list[JSON], events: list[JSON]) -> list[JSON]:
    """The log with `events` written in by sequence number (a rewritten number replaces
    the old event, as in the SQL stores)."""
    by_seq = {int(e["sequence_number"]): e for e in log}
    for event in events:
        by_seq[int(event["sequence_number"])] = event
    return [by_seq[n] for n in sorted(by_seq)]
