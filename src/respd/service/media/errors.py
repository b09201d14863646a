"""The errors media resolution raises: each names the field holding the bad data, with
OpenAI's image error codes where one fits; a `file_id` the owner cannot see is a 404, in
model input as in the Files API."""

from __future__ import annotations

from respd.protocol.errors import InvalidRequest, NotFound


def bad(message: str, param: str, code: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def too_many_bytes(param: str, what: str, limit: int) -> InvalidRequest:
    return bad(
        f"Invalid '{param}': the {what} is larger than this server's limit of {limit} bytes.",
        param,
        "image_file_too_large" if what == "image" else "file_too_large",
    )


def file_not_found(file_id: str, *, param: str = "file_id") -> NotFound:
    """404 for a file that is unknown, expired, deleted or someone else's (OpenAI's wording)."""
    return NotFound(f"No such File object: {file_id}", param=param)
