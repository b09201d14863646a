"""The Files API: uploaded bytes with OpenAI's `FileObject` metadata, owner-scoped, optionally
expiring. `read_file` reads a file and its bytes for the owner; its 404 is the one media
resolution raises for a `file_id` in model input (`media/errors.py`).

Nothing here knows about HTTP: `api/files.py` parses the multipart form (and stops reading an
upload once it is over `max_file_bytes`), this module validates and stores it.
"""

from __future__ import annotations

import mimetypes
import secrets
import time
from dataclasses import dataclass

from respd.protocol.errors import APIError, InvalidRequest, MissingParameter
from respd.service.media.cache import MediaCache
from respd.service.media.errors import file_not_found
from respd.service.pages import page
from respd.service.quotas import KeyQuotas
from respd.store.base import JSON, FileRecord, Store

# The `purpose` values OpenAI's `files.create` accepts.
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
EXPIRES_AFTER_ANCHORS = ("created_at",)
MIN_EXPIRES_AFTER = 3600  # 1 hour
MAX_EXPIRES_AFTER = 2592000  # 30 days
BATCH_DEFAULT_EXPIRES_AFTER = 2592000  # OpenAI: batch files expire after 30 days by default
DEFAULT_MAX_FILE_BYTES = 64 << 20
LIST_DEFAULT_LIMIT = 10000
LIST_MAX_LIMIT = 10000
OCTET_STREAM = "application/octet-stream"


@dataclass
class Upload:
    """The `file` part of an upload, as the HTTP layer read it."""

    filename: str | None
    content: bytes
    content_type: str | None = None


class FileTooLarge(APIError):
    """413: the upload is over `--max-file-bytes`; nothing was stored."""

    status_code = 413

    def __init__(self, max_bytes: int, size: int | None = None) -> None:
        got = f" ({size} bytes)" if size is not None else ""
        super().__init__(
            f"The file is too large{got}: this server accepts files of at most {max_bytes} "
            "bytes (--max-file-bytes).",
            param="file",
            code="file_too_large",
        )


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def mime_type_of(filename: str, content_type: str | None) -> str:
    """The part's content type if it says something, else a guess from the name, else
    `application/octet-stream`."""
    declared = (content_type or "").strip()
    essence = declared.split(";", 1)[0].strip().lower()
    if "/" in essence and essence != OCTET_STREAM:
        return declared
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    return guessed or OCTET_STREAM


def _purpose(purpose: str | None) -> str:
    if purpose is None or purpose == "":
        raise MissingParameter("purpose")
    if purpose not in PURPOSES:
        allowed = ", ".join(f"'{p}'" for p in PURPOSES)
        raise InvalidRequest(
            f"Invalid value for 'purpose': expected one of {allowed}, got '{purpose}'.",
            param="purpose",
            code="invalid_value",
        )
    return purpose


def _expires_after(anchor: str | None, seconds: str | None, purpose: str) -> int | None:
    """Seconds after `created_at` the file expires, or None (kept until deleted)."""
    if anchor is None and seconds is None:
        return BATCH_DEFAULT_EXPIRES_AFTER if purpose == "batch" else None
    if anchor is None:
        raise MissingParameter("expires_after.anchor")
    if seconds is None:
        raise MissingParameter("expires_after.seconds")
    if anchor not in EXPIRES_AFTER_ANCHORS:
        raise InvalidRequest(
            f"Invalid value for 'expires_after.anchor': expected 'created_at', got '{anchor}'.",
            param="expires_after.anchor",
            code="invalid_value",
        )
    try:
        value = int(seconds)
    except ValueError:
        raise InvalidRequest(
            f"Invalid type for 'expires_after.seconds': expected an integer, got '{seconds}'.",
            param="expires_after.seconds",
            code="invalid_type",
        ) from None
    if not MIN_EXPIRES_AFTER <= value <= MAX_EXPIRES_AFTER:
        raise InvalidRequest(
            f"Invalid 'expires_after.seconds': expected a value between {MIN_EXPIRES_AFTER} "
            f"and {MAX_EXPIRES_AFTER}, got {value}.",
            param="expires_after.seconds",
            code="invalid_value",
        )
    return value


async def read_file(
    store: Store, owner: str, file_id: str, *, param: str
) -> tuple[FileRecord, bytes]:
    """A file and its bytes for model input; 404 naming `param` (the request path of the
    `file_id`, e.g. `input[0].content[1].file_id`) when the owner cannot see it."""
    record = await store.get_file(owner, file_id)
    content = await store.file_content(owner, file_id) if record is not None else None
    if record is None or content is None:  # content None: deleted between the two reads
        raise file_not_found(file_id, param=param)
    return record, content


class FilesService:
    def __init__(
        self,
        store: Store,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        media_cache: MediaCache | None = None,
        quotas: KeyQuotas | None = None,
    ) -> None:
        self.store = store
        self.max_file_bytes = max_file_bytes
        self.media_cache = media_cache
        self.quotas = quotas

    async def create(
        self,
        owner: str,
        upload: Upload | None,
        purpose: str | None,
        *,
        expires_after_anchor: str | None = None,
        expires_after_seconds: str | None = None,
    ) -> JSON:
        if upload is None:
            raise MissingParameter("file")
        checked_purpose = _purpose(purpose)
        expires_after = _expires_after(expires_after_anchor, expires_after_seconds, checked_purpose)
        size = len(upload.content)
        if size > self.max_file_bytes:
            raise FileTooLarge(self.max_file_bytes, size)
        if size == 0:
            raise InvalidRequest("The uploaded file is empty.", param="file", code="empty_file")
        if self.quotas is not None:
            await self.quotas.check_storage(self.store, owner, size)
        filename = upload.filename or "upload"
        created_at = int(time.time())
        record = FileRecord(
            id=new_file_id(),
            owner=owner,
            created_at=created_at,
            filename=filename,
            purpose=checked_purpose,
            bytes=size,
            mime_type=mime_type_of(filename, upload.content_type),
            expires_at=created_at + expires_after if expires_after is not None else None,
        )
        await self.store.save_file(record, upload.content)
        return record.as_object()

    async def list_files(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int | None = None,
        order: str | None = None,
    ) -> JSON:
        files = await self.store.list_files(owner)
        if purpose:
            files = [f for f in files if f.purpose == purpose]
        return page(
            [f.as_object() for f in files],
            after=after,
            limit=limit,
            order=order,
            default_limit=LIST_DEFAULT_LIMIT,
            max_limit=LIST_MAX_LIMIT,
        )

    async def retrieve(self, owner: str, file_id: str) -> JSON:
        record = await self.store.get_file(owner, file_id)
        if record is None:
            raise file_not_found(file_id)
        return record.as_object()

    async def content(self, owner: str, file_id: str) -> tuple[FileRecord, bytes]:
        return await read_file(self.store, owner, file_id, param="file_id")

    async def delete(self, owner: str, file_id: str) -> JSON:
        if not await self.store.delete_file(owner, file_id):
            raise file_not_found(file_id)
        if self.media_cache is not None:  # what was decoded from it goes with it
            self.media_cache.forget_file(owner, file_id)
        return {"id": file_id, "object": "file", "deleted": True}
