"""The store protocol: what the service layer may persist and read back.

Records are plain JSON-able data (the wire shapes of responses and items), so every
implementation stores the same thing and `store/` knows nothing of Responses semantics.
Every record carries its `owner`, and every read takes one: a record is invisible to any
other identity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

JSON = dict[str, Any]

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


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
    """Persistence for responses, conversations and background event logs.

    Each write is atomic: a crash mid-write leaves the previous state, never half a record.
    Reads return `None` (or `False`) for ids that are unknown *or owned by someone else*.
    """

    async def save_response(
        self,
        record: ResponseRecord,
        *,
        conversation: tuple[str, list[JSON]] | None = None,
        events: list[JSON] | None = None,
    ) -> None:
        """Insert or replace `record` (a finished record is never replaced by an unfinished
        one); in the same transaction append `conversation=(id, items)` to that conversation
        (skipped if it is gone) and `events` to its event log."""
        ...

    async def append_events(self, response_id: str, events: list[JSON]) -> None:
        """Append stream events of a running background response to its log."""
        ...

    async def get_response(self, owner: str, response_id: str) -> ResponseRecord | None: ...

    async def delete_response(self, owner: str, response_id: str) -> bool:
        """Delete a response and its event log."""
        ...

    async def read_events(self, owner: str, response_id: str, after: int) -> list[JSON]:
        """Recorded stream events with `sequence_number > after`, in order."""
        ...

    async def unfinished_responses(self) -> list[ResponseRecord]:
        """Responses of every owner left `queued`/`in_progress` (e.g. by a crash)."""
        ...

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

    async def close(self) -> None: ...
