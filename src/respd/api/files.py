"""`/v1/files` routes (the Files API): multipart uploads, listing, metadata, raw content."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from starlette.datastructures import FormData, UploadFile
from starlette.types import Message

from respd.api.identity import owner_of
from respd.protocol.errors import InvalidRequest
from respd.service.files import FilesService, FileTooLarge, Upload

router = APIRouter()

# Room for the multipart framing and the small fields around the file's own bytes: a body
# longer than `max_file_bytes` plus this is refused before (or while) it is read.
FORM_OVERHEAD_BYTES = 64 * 1024
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
# A file's bytes are whatever a client uploaded, HTML and SVG included: a browser that
# opens them saves them (`attachment`, on every file), never guesses another type
# (`nosniff`), and runs nothing, were it to render them (a sandbox with no sources).
CONTENT_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; sandbox",
}


def _service(request: Request) -> FilesService:
    return request.app.state.files


async def _read_form(request: Request, max_bytes: int) -> FormData:
    """The upload's form, read at most `max_bytes` + framing into (spooled) memory."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in _FORM_TYPES:
        raise InvalidRequest(
            "POST /v1/files takes a multipart/form-data body with 'file' and 'purpose' "
            f"(got content-type '{content_type or 'none'}').",
            param=None,
            code="invalid_content_type",
        )
    cap = max_bytes + FORM_OVERHEAD_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise FileTooLarge(max_bytes)
    received = 0

    async def receive() -> Message:  # counts a chunked body too, and stops it at the cap
        nonlocal received
        message = await request.receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > cap:
                raise FileTooLarge(max_bytes)
        return message

    return await Request(request.scope, receive).form(max_files=1, max_fields=16)


def _text_field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise InvalidRequest(
        f"Invalid type for '{name}': expected a string, got a file.",
        param=name,
        code="invalid_type",
    )


async def _upload(form: FormData) -> Upload | None:
    part = form.get("file")
    if part is None:
        return None
    if not isinstance(part, UploadFile):
        raise InvalidRequest(
            "Invalid type for 'file': expected a file upload (a multipart part with a "
            "filename), got a string.",
            param="file",
            code="invalid_type",
        )
    return Upload(part.filename, await part.read(), part.content_type)


@router.post("/v1/files")
@router.post("/files", include_in_schema=False)
async def create_file(request: Request) -> dict[str, Any]:
    service = _service(request)
    form = await _read_form(request, service.max_file_bytes)
    try:
        return await service.create(
            owner_of(request),
            await _upload(form),
            _text_field(form, "purpose"),
            expires_after_anchor=_text_field(form, "expires_after[anchor]"),
            expires_after_seconds=_text_field(form, "expires_after[seconds]"),
        )
    finally:
        await form.close()


@router.get("/v1/files")
@router.get("/files", include_in_schema=False)
async def list_files(
    request: Request,
    purpose: str | None = None,
    after: str | None = None,
    limit: int | None = None,
    order: str = "desc",
) -> dict[str, Any]:
    return await _service(request).list_files(
        owner_of(request), purpose=purpose, after=after, limit=limit, order=order
    )


@router.get("/v1/files/{file_id}")
@router.get("/files/{file_id}", include_in_schema=False)
async def retrieve_file(request: Request, file_id: str) -> dict[str, Any]:
    return await _service(request).retrieve(owner_of(request), file_id)


@router.delete("/v1/files/{file_id}")
@router.delete("/files/{file_id}", include_in_schema=False)
async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
    return await _service(request).delete(owner_of(request), file_id)


@router.get("/v1/files/{file_id}/content")
@router.get("/files/{file_id}/content", include_in_schema=False)
async def file_content(request: Request, file_id: str) -> Response:
    record, content = await _service(request).content(owner_of(request), file_id)
    filename = quote(record.filename, safe="")
    return Response(
        content,
        headers={  # the stored type exactly (no charset added), and the original name
            "content-type": record.mime_type,
            **CONTENT_HEADERS,
            "content-disposition": f"attachment; filename*=UTF-8''{filename}",
        },
    )
