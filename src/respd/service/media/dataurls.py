"""Data URLs (`data:[TYPE][;base64],DATA`), the inline way to send an image or a file."""

from __future__ import annotations

import base64
import binascii
import urllib.parse

from respd.service.media.errors import bad, too_many_bytes


def parse_data_url(url: str, param: str, *, limit: int, what: str) -> tuple[str, bytes]:
    """`data:[TYPE][;base64],DATA` → (TYPE lowercased, bytes), refusing more than `limit`
    bytes before decoding them."""
    header, sep, payload = url[len("data:") :].partition(",")
    if not sep:
        raise bad(
            f"Invalid '{param}': a data URL needs a ',' before its data.",
            param,
            "invalid_base64_image" if what == "image" else "invalid_file_data",
        )
    fields = [f.strip().lower() for f in header.split(";")]
    mime = fields[0]
    if "base64" in fields[1:]:
        payload = "".join(payload.split())
        if len(payload) * 3 // 4 > limit + 3:
            raise too_many_bytes(param, what, limit)
        payload += "=" * (-len(payload) % 4)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad(
                f"Invalid '{param}': the data URL's {what} data is not valid base64.",
                param,
                "invalid_base64_image" if what == "image" else "invalid_file_data",
            ) from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > limit:
        raise too_many_bytes(param, what, limit)
    return mime, data
