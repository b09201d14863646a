"""Media in request input: images and files, fetched, decoded and checked before translation.

`MediaResolver` walks a request's input (Responses items or Chat messages) and, for every
`input_image` / `image_url` / `input_file` / `file` part, turns its source (a data URI, a
`file_id` in the store, or, with `--allow-remote-media`, an `http(s)` URL) into checked
bytes: an `Image` Pillow has decoded within the limits, or a `FileText` holding a document's
text. The result maps each part's path (`input[0].content[1]`) to what it resolved to;
`lowering.py` then lowers the conversation from it without doing any I/O itself. Results are
kept by source in a `MediaCache` (`cache.py`), so replayed history is not resolved twice.

The checks themselves live beside it: `dataurls.py`, `images.py`, `documents.py`, `fetch.py`
(remote URLs), with the value types in `values.py` and the errors in `errors.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from respd.engines.base import Image
from respd.protocol.errors import InvalidRequest, MissingParameter
from respd.service.media.cache import FILE, URL, Key, MediaCache
from respd.service.media.dataurls import parse_data_url
from respd.service.media.documents import document_text
from respd.service.media.errors import bad, file_not_found, too_many_bytes
from respd.service.media.fetch import fetch_remote
from respd.service.media.images import check_image
from respd.service.media.parts import FILE_PARTS, IMAGE_PARTS
from respd.service.media.settings import MIB, MediaSettings
from respd.service.media.values import CheckedImage, FileText, Media, Resolved
from respd.store.base import JSON, FileRecord, Store

# The media vocabulary as callers import it from here.
__all__ = [
    "CheckedImage",
    "FileText",
    "Media",
    "MediaResolver",
    "MediaSettings",
    "Resolved",
    "check_image",
    "document_text",
    "fetch_remote",
]

R = TypeVar("R", Image, FileText)
# Data URLs longer than this are hashed off the event loop (hashlib releases the GIL).
_HASH_IN_THREAD = MIB


def _is_http(url: str) -> bool:
    return url[:7].lower() == "http://" or url[:8].lower() == "https://"


def _name_from_url(url: str) -> str:
    return posixpath.basename(urllib.parse.urlsplit(url).path) or "file"


def _url_digest(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()


class MediaResolver:
    """Resolves every media part of an input, owner-scoped for `file_id`s."""

    def __init__(self, store: Store, settings: MediaSettings | None = None) -> None:
        self.store = store
        self.settings = settings or MediaSettings()
        self.cache = MediaCache(self.settings.cache_bytes)

    # The walks: which parts of which items hold media. They skip malformed shapes;
    # translation reports those with their exact paths.

    async def resolve_items(
        self, items: Any, owner: str, prefix: str = "input"
    ) -> dict[str, Resolved]:
        """Responses `input` (or stored items): message content and array tool outputs."""
        found: dict[str, Resolved] = {}
        if not isinstance(items, list):
            return found
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message")
            if kind == "message":
                await self._parts(item.get("content"), f"{prefix}[{i}].content", owner, found)
            elif kind == "function_call_output":
                await self._parts(item.get("output"), f"{prefix}[{i}].output", owner, found)
        return found

    async def resolve_messages(self, messages: Any, owner: str) -> dict[str, Resolved]:
        """Chat Completions `messages`."""
        found: dict[str, Resolved] = {}
        for i, msg in enumerate(messages if isinstance(messages, list) else []):
            if isinstance(msg, dict):
                await self._parts(msg.get("content"), f"messages[{i}].content", owner, found)
        return found

    async def _parts(
        self, content: Any, param: str, owner: str, found: dict[str, Resolved]
    ) -> None:
        if not isinstance(content, list):
            return
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            p = f"{param}[{j}]"
            kind = part.get("type")
            if kind in IMAGE_PARTS:
                found[p] = await self.image(part, p, owner)
            elif kind in FILE_PARTS:
                found[p] = await self.document(part, p, owner)

    async def _cached(self, key: Key, kind: type[R], resolve: Callable[[], Awaitable[R]]) -> R:
        """What `key` resolved to before, else `resolve()` (kept when it succeeds; a URL's
        result only for `url_cache_ttl_secs`)."""
        hit = self.cache.get(key)
        if isinstance(hit, kind):
            return hit
        value = await resolve()
        ttl = self.settings.url_cache_ttl_secs if key[0] == URL else None
        self.cache.put(key, value, ttl)
        return value

    async def _data_key(self, what: str, url: str, *rest: str) -> Key:
        digest = (
            await asyncio.to_thread(_url_digest, url)
            if len(url) > _HASH_IN_THREAD
            else _url_digest(url)
        )
        return ("data", what, digest, *rest)

    # Images.

    async def image(self, part: JSON, p: str, owner: str) -> Image:
        if part.get("type") == "image_url":  # Chat: {"image_url": {"url", "detail"}}
            inner = part.get("image_url")
            url = inner.get("url") if isinstance(inner, dict) else inner
            if not isinstance(url, str) or not url:
                raise MissingParameter(f"{p}.image_url.url")
            return await self._image_url(url, f"{p}.image_url.url")
        url, file_id = part.get("image_url"), part.get("file_id")
        if isinstance(url, str) and url:
            return await self._image_url(url, f"{p}.image_url")
        if isinstance(file_id, str) and file_id:
            param = f"{p}.file_id"
            record = await self._file_record(owner, file_id, param)

            async def load() -> Image:
                data = await self._file_content(record, param)
                if len(data) > self.settings.max_image_bytes:
                    raise too_many_bytes(param, "image", self.settings.max_image_bytes)
                return await asyncio.to_thread(
                    check_image, data, record.mime_type, param, self.settings
                )

            return await self._cached(_file_key(record, "image"), Image, load)
        raise InvalidRequest(
            f"Missing required parameter: '{p}.image_url' (or '{p}.file_id').",
            param=f"{p}.image_url",
            code="missing_required_parameter",
        )

    async def _image_url(self, url: str, param: str) -> Image:
        limit = self.settings.max_image_bytes
        if url[:5].lower() == "data:":

            async def decode() -> Image:
                declared, data = parse_data_url(url, param, limit=limit, what="image")
                return await asyncio.to_thread(check_image, data, declared, param, self.settings)

            return await self._cached(await self._data_key("image", url), Image, decode)
        if _is_http(url):
            self._check_remote(param, "image")

            async def fetch() -> Image:
                data, declared, _ = await self._fetch(url, param, limit=limit, what="image")
                return await asyncio.to_thread(check_image, data, declared, param, self.settings)

            return await self._cached((URL, "image", url), Image, fetch)
        raise bad(
            f"Invalid '{param}': expected a data URL (data:image/png;base64,...) or an "
            "http(s) URL.",
            param,
            "invalid_image_url",
        )

    def _check_remote(self, param: str, what: str) -> None:
        """Refuse a remote URL unless `--allow-remote-media` allows fetching at all (before
        the cache is asked, so switching it off cannot be bypassed)."""
        if not self.settings.allow_remote_media:
            raise bad(
                f"Invalid '{param}': this server does not fetch remote {what} URLs (it was "
                "started without --allow-remote-media); send the data inline as a data URL "
                "or upload it and pass its file_id.",
                param,
                "remote_media_disabled",
            )

    async def _fetch(
        self, url: str, param: str, *, limit: int, what: str
    ) -> tuple[bytes, str, str]:
        """A remote image or file, when `--allow-remote-media` allows fetching at all."""
        self._check_remote(param, what)
        return await fetch_remote(
            url, param, limit=limit, timeout=self.settings.remote_media_timeout_secs, what=what
        )

    # Documents.

    async def document(self, part: JSON, p: str, owner: str) -> FileText:
        if part.get("type") == "file":  # Chat: {"file": {"file_id" | "file_data", "filename"}}
            inner = part.get("file")
            if not isinstance(inner, dict):
                raise MissingParameter(f"{p}.file")
            part, p = inner, f"{p}.file"
        filename = part.get("filename")
        name = filename if isinstance(filename, str) and filename else None
        limit = self.settings.max_input_file_bytes
        sources = [k for k in ("file_id", "file_data", "file_url") if part.get(k) is not None]
        if len(sources) > 1:
            raise InvalidRequest(
                f"Invalid '{p}': give exactly one of 'file_id', 'file_data' and 'file_url'.",
                param=f"{p}.{sources[1]}",
                code="invalid_value",
            )
        source = sources[0] if sources else None
        value = part.get(source) if source else None
        if source is None or not isinstance(value, str) or not value:
            raise InvalidRequest(
                f"Missing required parameter: '{p}.file_id' (or '{p}.file_data' or "
                f"'{p}.file_url').",
                param=f"{p}.{source or 'file_id'}",
                code="missing_required_parameter",
            )
        param = f"{p}.{source}"
        # The name is part of each key: it picks the document's kind and heads its block.
        if source == "file_id":
            record = await self._file_record(owner, value, param)
            stored_name = record.filename or name or "file"

            async def read_stored() -> FileText:
                data = await self._file_content(record, param)
                return await asyncio.to_thread(
                    document_text, data, record.mime_type, stored_name, param
                )

            return await self._cached(
                _file_key(record, "document", stored_name), FileText, read_stored
            )
        if source == "file_data":
            url = value if value[:5].lower() == "data:" else "data:;base64," + value

            async def decode() -> FileText:  # bare base64 too, as some clients send it
                mime, data = parse_data_url(url, param, limit=limit, what="file")
                return await asyncio.to_thread(document_text, data, mime, name or "file", param)

            key = await self._data_key("document", url, name or "")
            return await self._cached(key, FileText, decode)
        if not _is_http(value):
            raise bad(f"Invalid '{param}': expected an http(s) URL.", param, "invalid_file_url")
        self._check_remote(param, "file")

        async def fetch() -> FileText:
            data, mime, final = await self._fetch(value, param, limit=limit, what="file")
            title = name or _name_from_url(final)
            return await asyncio.to_thread(document_text, data, mime, title, param)

        return await self._cached((URL, "document", value, name or ""), FileText, fetch)

    # Stored files (owner-scoped). The record is read on every use, cached or not, so a
    # deleted, expired or someone else's file stays a 404.

    async def _file_record(self, owner: str, file_id: str, param: str) -> FileRecord:
        record = await self.store.get_file(owner, file_id)
        if record is None:
            raise file_not_found(file_id, param=param)
        return record

    async def _file_content(self, record: FileRecord, param: str) -> bytes:
        data = await self.store.file_content(record.owner, record.id)
        if data is None:  # deleted since its record was read
            raise file_not_found(record.id, param=param)
        return data


def _file_key(record: FileRecord, what: str, *rest: str) -> Key:
    """A stored file's key: its id with its creation time and size, so it can only ever
    name the bytes that were decoded."""
    return (FILE, record.owner, record.id, record.created_at, record.bytes, what, *rest)
