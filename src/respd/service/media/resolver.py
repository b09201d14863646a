"""Media in request input: images and files, fetched, decoded and checked before translation.

`MediaResolver` walks a request's input (Responses items or Chat messages) and, for every
`input_image` / `image_url` / `input_file` / `file` part, turns its source (a data URI, a
`file_id` in the store, or, with `--allow-remote-media`, an `http(s)` URL) into checked
bytes: an `Image` Pillow has decoded within the limits, or a `FileText` holding a document's
text. The result maps each part's path (`input[0].content[1]`) to what it resolved to;
`lowering.py` then lowers the conversation from it without doing any I/O itself. Results are
kept by source in a `MediaCache` (`cache.py`), so replayed history is not resolved twice.

Errors name the field that holds the bad data (`input[0].content[1].image_url`), with
OpenAI's image error codes where one fits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import ipaddress
import mimetypes
import posixpath
import socket
import urllib.parse
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from respd.engines.base import Image
from respd.protocol.errors import APIError, InvalidRequest, MissingParameter
from respd.service.files import file_not_found
from respd.service.media.cache import (
    DEFAULT_MEDIA_CACHE_MB,
    DEFAULT_URL_CACHE_TTL_SECS,
    FILE,
    URL,
    Key,
    MediaCache,
)
from respd.service.media.parts import (
    DEFAULT_IMAGE_INPUT_FALLBACK,
    FILE_PARTS,
    IMAGE_PARTS,
    ImageFallback,
)
from respd.store.base import JSON, FileRecord, Store

MIB = 2**20
# Pillow format name → the MIME type an engine is told.
IMAGE_FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}
_MIME_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
    "image/x-bmp": "image/bmp",
}
# Declared types that say nothing: the bytes decide.
_GENERIC_TYPES = ("", "application/octet-stream", "binary/octet-stream", "image/*")
MAX_REDIRECTS = 5

# Documents read as text: text/* plus these types and extensions.
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/javascript",
        "application/x-javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-shellscript",
        "application/x-python",
        "application/x-python-code",
        "application/sql",
        "application/x-tex",
        "application/x-latex",
        "application/csv",
        "application/x-httpd-php",
        "application/graphql",
    }
)
TEXT_EXTENSIONS = frozenset(
    [
        ".txt",
        ".text",
        ".md",
        ".markdown",
        ".rst",
        ".adoc",
        ".org",
        ".tex",
        ".json",
        ".jsonl",
        ".ndjson",
        ".csv",
        ".tsv",
        ".xml",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".conf",
        ".env",
        ".log",
        ".html",
        ".htm",
        ".css",
        ".scss",
        ".js",
        ".mjs",
        ".cjs",
        ".ts",
        ".tsx",
        ".jsx",
        ".py",
        ".pyi",
        ".rb",
        ".php",
        ".pl",
        ".sh",
        ".bash",
        ".zsh",
        ".fish",
        ".ps1",
        ".bat",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".cxx",
        ".hpp",
        ".hh",
        ".cs",
        ".java",
        ".kt",
        ".kts",
        ".scala",
        ".go",
        ".rs",
        ".swift",
        ".m",
        ".mm",
        ".r",
        ".jl",
        ".lua",
        ".dart",
        ".ex",
        ".exs",
        ".erl",
        ".hs",
        ".ml",
        ".fs",
        ".clj",
        ".sql",
        ".graphql",
        ".proto",
        ".vue",
        ".svelte",
        ".dockerfile",
        ".makefile",
        ".cmake",
        ".gradle",
        ".patch",
        ".diff",
        ".svg",
    ]
)
PDF_TYPE = "application/pdf"


@dataclass(frozen=True)
class MediaSettings:
    """Limits and switches for media in requests (the `--max-image-*`, `--max-file-bytes`
    and `--*-remote-media*` flags)."""

    max_image_bytes: int = 20 * MIB  # the encoded image file
    max_image_pixels: int = 33_177_600  # width x height once decoded
    max_image_side: int = 8192  # width or height
    max_input_file_bytes: int = 32 * MIB  # an `input_file` document given inline or by URL
    allow_remote_media: bool = False
    remote_media_timeout_secs: float = 10.0
    cache_bytes: int = DEFAULT_MEDIA_CACHE_MB * MIB  # resolved media kept by source; 0: none
    url_cache_ttl_secs: float = DEFAULT_URL_CACHE_TTL_SECS  # how long a URL's entry holds
    image_input_fallback: ImageFallback = DEFAULT_IMAGE_INPUT_FALLBACK


@dataclass(frozen=True, eq=False)
class CheckedImage(Image):
    """An image as `check_image` found it: its pixel size rides along for a model that
    cannot see it (the placeholder text names it)."""

    width: int = 0
    height: int = 0


@dataclass(frozen=True)
class FileText:
    """A document lowered to the text the model reads."""

    filename: str
    text: str

    def block(self) -> str:
        """`<file name="NAME">\\nTEXT\\n</file>` (quotes and newlines in NAME neutralised)."""
        name = self.filename.replace('"', "'").replace("\n", " ").replace("\r", " ")
        return f'<file name="{name}">\n{self.text}\n</file>'


Resolved = Image | FileText
Media = Mapping[str, Resolved]
R = TypeVar("R", Image, FileText)
# Data URLs longer than this are hashed off the event loop (hashlib releases the GIL).
_HASH_IN_THREAD = MIB


def _bad(message: str, param: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


# -- data URLs ----------------------------------------------------------------------------


def parse_data_url(url: str, param: str, *, limit: int, what: str) -> tuple[str, bytes]:
    """`data:[TYPE][;base64],DATA` → (TYPE lowercased, bytes), refusing more than `limit`
    bytes before decoding them."""
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep:
        raise _bad(
            f"Invalid '{param}': a data URL needs a ',' before its data.",
            param,
            "invalid_base64_image" if what == "image" else "invalid_file_data",
        )
    fields = [f.strip().lower() for f in header.split(";")]
    mime = fields[0]
    if "base64" in fields[1:]:
        payload = "".join(payload.split())
        if len(payload) * 3 // 4 > limit + 3:
            raise _too_many_bytes(param, what, limit)
        payload += "=" * (-len(payload) % 4)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(
                f"Invalid '{param}': the data URL's {what} data is not valid base64.",
                param,
                "invalid_base64_image" if what == "image" else "invalid_file_data",
            ) from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise _too_many_bytes(param, what, limit)
    return mime, data


def _too_many_bytes(param: str, what: str, limit: int) -> InvalidRequest:
    return _bad(
        f"Invalid '{param}': the {what} is larger than this server's limit of {limit} bytes.",
        param,
        "image_file_too_large" if what == "image" else "file_too_large",
    )


# -- images -------------------------------------------------------------------------------


def check_image(data: bytes, declared: str, param: str, settings: MediaSettings) -> CheckedImage:
    """Decode `data` with Pillow within the limits; the returned Image carries the MIME type
    of the format actually found (a mislabelled PNG is still a PNG)."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if not data:
        raise _bad(f"Invalid '{param}': the image is empty.", param, "empty_image_file")
    if len(data) > settings.max_image_bytes:
        raise _too_many_bytes(param, "image", settings.max_image_bytes)
    declared = _MIME_ALIASES.get(declared, declared)
    if declared not in _GENERIC_TYPES and declared not in IMAGE_FORMATS.values():
        raise _unsupported_image(declared, param)
    too_large = _bad(
        f"Invalid '{param}': the image is too large; at most {settings.max_image_side} pixels "
        f"a side and {settings.max_image_pixels} pixels in all are accepted.",
        param,
        "image_too_large",
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data)) as img:
                fmt = img.format or ""
                if fmt not in IMAGE_FORMATS:
                    raise _unsupported_image(
                        img.get_format_mimetype() or f"image/{fmt.lower()}", param
                    )
                width, height = img.size
                if (
                    max(width, height) > settings.max_image_side
                    or width * height > settings.max_image_pixels
                ):
                    raise too_large
                img.load()  # decode every pixel: truncated or corrupt data fails here
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning):
        raise too_large from None
    except UnidentifiedImageError:
        raise _bad(
            f"Invalid '{param}': the data is not an image in a supported format "
            f"({', '.join(IMAGE_FORMATS.values())}).",
            param,
            "invalid_image",
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise _bad(
            f"Invalid '{param}': the image could not be decoded ({exc}).", param, "invalid_image"
        ) from None
    return CheckedImage(data, IMAGE_FORMATS[fmt], width=width, height=height)


def _unsupported_image(mime: str, param: str) -> InvalidRequest:
    return _bad(
        f"Invalid '{param}': unsupported image type '{mime}'. Supported types: "
        f"{', '.join(IMAGE_FORMATS.values())}.",
        param,
        "unsupported_image_media_type",
    )


# -- documents ----------------------------------------------------------------------------


def document_kind(mime: str, filename: str, data: bytes) -> str | None:
    """'pdf', 'text', or None (unsupported) from the declared type, the name and the bytes."""
    mime = mime.split(";")[0].strip().lower()
    ext = posixpath.splitext(filename.lower())[1] or (
        "." + filename.lower() if filename.lower() in ("dockerfile", "makefile") else ""
    )
    if mime in _GENERIC_TYPES:
        if ext == ".pdf" or data.startswith(b"%PDF-"):
            return "pdf"
        if ext in TEXT_EXTENSIONS:
            return "text"
        guessed = mimetypes.guess_type(filename)[0] or ""
        if guessed.startswith("text/") or guessed in TEXT_TYPES:
            return "text"
        return None
    if mime == PDF_TYPE:
        return "pdf"
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(("+json", "+xml")):
        return "text"
    return None


def _effective_type(mime: str, filename: str) -> str:
    mime = mime.split(";")[0].strip().lower()
    if mime in _GENERIC_TYPES:
        return mimetypes.guess_type(filename)[0] or mime or "application/octet-stream"
    return mime


def document_text(data: bytes, mime: str, filename: str, param: str) -> FileText:
    """The text of a document: UTF-8 text files as they are (one trailing newline
    dropped), PDFs through pypdf's text extraction (pages joined by a blank line)."""
    kind = document_kind(mime, filename, data)
    if kind is None:
        raise _bad(
            f"Invalid '{param}': unsupported file type '{_effective_type(mime, filename)}' "
            f"for '{filename}'. Supported: PDF, and text files (plain text, Markdown, JSON, "
            "CSV, XML, YAML, source code).",
            param,
            "unsupported_file_type",
        )
    if kind == "pdf":
        text = _pdf_text(data, filename, param)
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = ""
            bad = True
        else:
            bad = "\x00" in text
        if bad:
            raise _bad(
                f"Invalid '{param}': the file '{filename}' is not UTF-8 text.",
                param,
                "invalid_file_encoding",
            )
        text = text.removesuffix("\n").removesuffix("\r")
    return FileText(filename, text)


def _pdf_text(data: bytes, filename: str, param: str) -> str:
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-PDF chatter
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise _bad(
                f"Invalid '{param}': the PDF '{filename}' is encrypted.", param, "invalid_file"
            )
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except APIError:
        raise
    except (PdfReadError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _bad(
            f"Invalid '{param}': the PDF '{filename}' could not be read ({exc}).",
            param,
            "invalid_file",
        ) from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise _bad(
            f"Invalid '{param}': the PDF '{filename}' has no extractable text (scanned pages "
            "are not OCRed).",
            param,
            "file_has_no_text",
        )
    return text


# -- remote URLs --------------------------------------------------------------------------


def address_refused(address: str) -> bool:
    """True for any address a server-side fetch must not reach: loopback, private,
    link-local, shared, multicast, reserved or unspecified (IPv4-mapped IPv6 included)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        not ip.is_global
        or ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


async def _pinned_address(url: httpx.URL, param: str) -> str:
    """The one address to connect to for `url`, after every address its host resolves to
    passed `address_refused` (so DNS cannot swap in a private one between check and use)."""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            url.host, port, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise _bad(
            f"Invalid '{param}': the host '{url.host}' could not be resolved ({exc}).",
            param,
            "failed_to_download",
        ) from None
    addresses = [str(info[4][0]) for info in infos]
    refused = [a for a in addresses if address_refused(a)]
    if refused or not addresses:
        raise _bad(
            f"Invalid '{param}': refusing to fetch from '{url.host}': it resolves to "
            f"{', '.join(refused) or 'nothing'}, a loopback, private, link-local or reserved "
            "address.",
            param,
            "remote_address_not_allowed",
        )
    return addresses[0]


async def fetch_remote(
    url: str, param: str, *, limit: int, timeout: float, what: str
) -> tuple[bytes, str, str]:
    """GET an http(s) URL, checking the address of every redirect hop, within `timeout`
    seconds and `limit` bytes → (body, content type, final URL)."""
    failed = "failed_to_download_image" if what == "image" else "failed_to_download_file"
    try:
        async with asyncio.timeout(timeout):
            async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
                current = httpx.URL(url)
                for _ in range(MAX_REDIRECTS + 1):
                    if current.scheme not in ("http", "https") or not current.host:
                        raise _bad(
                            f"Invalid '{param}': only http and https URLs can be fetched.",
                            param,
                            failed,
                        )
                    address = await _pinned_address(current, param)
                    request = client.build_request(
                        "GET",
                        current.copy_with(host=address),
                        headers={"host": current.netloc.decode("ascii")},
                        extensions={"sni_hostname": current.host},
                    )
                    response = await client.send(request, stream=True)
                    try:
                        if response.is_redirect and "location" in response.headers:
                            current = current.join(response.headers["location"])
                            continue
                        if response.status_code != 200:
                            raise _bad(
                                f"Invalid '{param}': fetching the {what} failed with HTTP "
                                f"{response.status_code}.",
                                param,
                                failed,
                            )
                        declared = response.headers.get("content-length", "")
                        if declared.isdigit() and int(declared) > limit:
                            raise _too_many_bytes(param, what, limit)
                        body = bytearray()
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > limit:
                                raise _too_many_bytes(param, what, limit)
                        content_type = response.headers.get("content-type", "")
                        return bytes(body), content_type.split(";")[0].strip().lower(), str(current)
                    finally:
                        await response.aclose()
                raise _bad(
                    f"Invalid '{param}': more than {MAX_REDIRECTS} redirects.", param, failed
                )
    except TimeoutError:
        raise _bad(
            f"Invalid '{param}': fetching the {what} took longer than {timeout:g} seconds.",
            param,
            failed,
        ) from None
    except httpx.HTTPError as exc:
        raise _bad(
            f"Invalid '{param}': fetching the {what} failed ({exc}).", param, failed
        ) from None


# -- the resolver -------------------------------------------------------------------------


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
                    raise _too_many_bytes(param, "image", self.settings.max_image_bytes)
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
        raise _bad(
            f"Invalid '{param}': expected a data URL (data:image/png;base64,...) or an "
            "http(s) URL.",
            param,
            "invalid_image_url",
        )

    def _check_remote(self, param: str, what: str) -> None:
        """Refuse a remote URL unless `--allow-remote-media` allows fetching at all (before
        the cache is asked, so switching it off cannot be bypassed)."""
        if not self.settings.allow_remote_media:
            raise _bad(
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
            raise _bad(f"Invalid '{param}': expected an http(s) URL.", param, "invalid_file_url")
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
