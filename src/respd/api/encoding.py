"""Compressed request bodies: `Content-Encoding: zstd | gzip | deflate | br` (Codex sends
zstd), decoded before any route parses them.

The decoded size is what the body limit bounds: every decoder is asked for at most one
byte past the limit, so a small body that would inflate to gigabytes (a zip bomb) is a
413 after `limit` bytes of work, never an allocation of its full size.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

import brotli
import zstandard

from respd.protocol.errors import APIError

Decoder = Callable[[bytes, int], bytes]


def _zlib(wbits: int) -> Decoder:
    def decode(raw: bytes, cap: int) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(raw, cap)
        if len(out) < cap and not d.eof:
            raise zlib.error("truncated stream")
        return out

    return decode


def _deflate(raw: bytes, cap: int) -> bytes:
    """HTTP's `deflate` is zlib-wrapped; some clients send the raw stream."""
    try:
        return _zlib(zlib.MAX_WBITS)(raw, cap)
    except zlib.error:
        return _zlib(-zlib.MAX_WBITS)(raw, cap)


def _zstd(raw: bytes, cap: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True)
    out = bytearray()
    while len(out) < cap:
        chunk = reader.read(min(cap - len(out), 1 << 20))
        if not chunk:
            break
        out += chunk
    if len(out) < cap:
        # The reader stops quietly at a cut-off frame; within the cap, a second pass says.
        check = zstandard.ZstdDecompressor().decompressobj()
        check.decompress(raw)
        if not check.eof:
            raise zstandard.ZstdError("truncated frame")
    return bytes(out)


def _brotli(raw: bytes, cap: int) -> bytes:
    d = brotli.Decompressor()
    out = bytearray(d.process(raw, output_buffer_limit=cap))
    while len(out) < cap and not d.is_finished() and not d.can_accept_more_data():
        out += d.process(b"", output_buffer_limit=cap - len(out))
    if len(out) < cap and not d.is_finished():
        raise brotli.error("truncated stream")
    return bytes(out)


DECODERS: dict[str, Decoder] = {
    "gzip": _zlib(16 + zlib.MAX_WBITS),
    "x-gzip": _zlib(16 + zlib.MAX_WBITS),
    "deflate": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}


class UnsupportedEncoding(APIError):
    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"Unsupported Content-Encoding '{encoding}': send identity, gzip, deflate, br or zstd.",
            status_code=415,
            code="unsupported_content_encoding",
        )


def encodings(header: str) -> list[str]:
    """The codings applied, in order (a body may be encoded more than once); `identity`
    dropped. Raises for one this server cannot decode."""
    names = [e.strip().lower() for e in header.split(",") if e.strip()]
    names = [e for e in names if e != "identity"]
    for name in names:
        if name not in DECODERS:
            raise UnsupportedEncoding(name)
    return names


def decode_body(raw: bytes, names: list[str], limit: int, too_large: APIError) -> bytes:
    """The body with every coding undone, last applied first; over `limit` decoded bytes
    raises `too_large`, a stream that does not decode is a 400."""
    body = raw
    for name in reversed(names):
        try:
            body = DECODERS[name](body, limit + 1)
        except (zlib.error, zstandard.ZstdError, brotli.error) as exc:
            raise APIError(
                f"The request body is not valid '{name}' data: {exc}.",
                code="invalid_content_encoding",
            ) from exc
        if len(body) > limit:
            raise too_large
    return body
