"""The Files API through the `openai` SDK against real servers (both stores); the store
classes' file methods are tested directly in tests/unit/store/test_files.py."""

from __future__ import annotations

import signal
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import FileDeleted, FileObject

from tests.support.servers import RespdServer, start_server

TEXT = b"Meeting notes\nAda: ship the Files API.\n"
BINARY = bytes(range(256)) * 5 + b"\x00\r\n\x1a\xff"  # every byte value, NULs, CR/LF, EOF


def _strict(obj: Any) -> FileObject:
    return FileObject.model_validate(obj.to_dict())


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def _ids(client: openai.OpenAI, **kw: Any) -> list[str]:
    return [f.id for f in client.files.list(**kw)]


# -- through the SDK, against both stores ----------------------------------------------------


def test_upload_retrieve_content_delete(
    sclient: openai.OpenAI, stateful_server: RespdServer
) -> None:
    before = int(time.time())
    created = _strict(
        sclient.files.create(file=("notes.txt", TEXT, "text/plain"), purpose="user_data")
    )
    assert created.id.startswith("file-") and created.object == "file"
    assert created.bytes == len(TEXT) and created.filename == "notes.txt"
    assert created.purpose == "user_data" and created.status == "processed"
    assert created.expires_at is None and before <= created.created_at <= int(time.time())
    assert _strict(sclient.files.retrieve(created.id)) == created
    assert sclient.files.content(created.id).read() == TEXT
    assert created.id in _ids(sclient)

    with httpx.Client(base_url=stateful_server.base_url) as http:
        raw = http.get(f"/v1/files/{created.id}/content")
        assert raw.status_code == 200 and raw.content == TEXT
        assert raw.headers["content-type"] == "text/plain"
        assert "notes.txt" in raw.headers["content-disposition"]
        assert http.get(f"/files/{created.id}").json() == created.model_dump()  # without /v1

    deleted = FileDeleted.model_validate(sclient.files.delete(created.id).to_dict())
    assert deleted.model_dump() == {"id": created.id, "object": "file", "deleted": True}
    for call in (sclient.files.retrieve, sclient.files.content, sclient.files.delete):
        with pytest.raises(openai.NotFoundError) as exc:
            call(created.id)
        assert exc.value.param == "file_id" and created.id in exc.value.message
    assert created.id not in _ids(sclient)
    with httpx.Client(base_url=stateful_server.base_url) as http:
        missing = http.get(f"/v1/files/{created.id}/content")
        assert missing.status_code == 404
        assert _error(missing)["message"] == f"No such File object: {created.id}"
        assert http.get("/v1/files/file-doesnotexist").status_code == 404


def test_binary_content_is_byte_exact_and_types_are_guessed(sclient: openai.OpenAI) -> None:
    blob = _strict(sclient.files.create(file=("blob.bin", BINARY), purpose="vision"))
    assert blob.bytes == len(BINARY)
    assert sclient.files.content(blob.id).read() == BINARY
    raw = sclient.files.with_raw_response.content(blob.id)
    assert raw.headers["content-type"] == "application/octet-stream"

    # A generic part type says nothing: the name decides; a specific one is kept as sent.
    pdf = sclient.files.create(
        file=("report.pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n", "application/octet-stream"),
        purpose="user_data",
    )
    pdf_raw = sclient.files.with_raw_response.content(pdf.id)
    assert pdf_raw.headers["content-type"] == "application/pdf"
    assert pdf_raw.content == b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"
    csv = sclient.files.create(file=("rows.dat", b"a,b\n1,2\n", "text/csv"), purpose="user_data")
    assert sclient.files.with_raw_response.content(csv.id).headers["content-type"] == "text/csv"
    for f in (blob, pdf, csv):
        sclient.files.delete(f.id)


def test_html_and_svg_come_back_as_inert_downloads(sclient: openai.OpenAI) -> None:
    for name, data in [
        ("page.html", b"<script>alert(1)</script>"),
        ("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>"),
    ]:
        made = sclient.files.create(file=(name, data), purpose="user_data")
        raw = sclient.files.with_raw_response.content(made.id)
        assert raw.content == data
        assert raw.headers["x-content-type-options"] == "nosniff"
        assert raw.headers["content-disposition"].startswith("attachment;")
        assert raw.headers["content-security-policy"] == "default-src 'none'; sandbox"
        sclient.files.delete(made.id)


def test_list_order_pagination_and_purpose_filter(sclient: openai.OpenAI) -> None:
    # `assistants` is this test's own purpose: no other test uploads with it.
    mine = [
        sclient.files.create(file=(f"doc{i}.txt", f"doc {i}".encode()), purpose="assistants").id
        for i in range(3)
    ]
    other = sclient.files.create(file=("other.txt", b"other"), purpose="user_data").id

    listed = sclient.files.list(purpose="assistants")
    assert [f.id for f in listed.data] == list(reversed(mine))  # default order: desc
    assert all(_strict(f).purpose == "assistants" for f in listed.data)
    assert other not in [f.id for f in listed.data] and other in _ids(sclient)

    first = sclient.files.list(purpose="assistants", order="asc", limit=2)
    assert [f.id for f in first.data] == mine[:2] and first.has_more is True
    second = sclient.files.list(purpose="assistants", order="asc", limit=2, after=mine[1])
    assert [f.id for f in second.data] == mine[2:] and second.has_more is False
    # The SDK's auto-pager follows the `after` cursor to the end.
    assert _ids(sclient, purpose="assistants", order="asc", limit=1) == mine
    assert _ids(sclient, purpose="assistants", order="desc", limit=2) == list(reversed(mine))

    bad_params: list[dict[str, Any]] = [
        {"limit": 0},
        {"limit": 10001},
        {"order": "sideways"},
        {"after": "file-nope"},
    ]
    for bad in bad_params:
        with pytest.raises(openai.BadRequestError) as exc:
            sclient.files.list(**bad)
        assert exc.value.param == next(iter(bad))
    for file_id in [*mine, other]:
        sclient.files.delete(file_id)
    assert sclient.files.list(purpose="assistants").data == []


def test_invalid_uploads_are_400_and_store_nothing(
    sclient: openai.OpenAI, stateful_server: RespdServer
) -> None:
    before = _ids(sclient)
    with pytest.raises(openai.BadRequestError) as exc:
        sclient.files.create(file=("a.txt", b"x"), purpose="nonsense")  # type: ignore[arg-type]
    assert exc.value.param == "purpose" and "nonsense" in exc.value.message

    with pytest.raises(openai.BadRequestError) as exc:
        sclient.files.create(file=("empty.txt", b""), purpose="user_data")
    assert exc.value.param == "file" and exc.value.code == "empty_file"

    for seconds in (3599, 2592001):
        with pytest.raises(openai.BadRequestError) as exc:
            sclient.files.create(
                file=("a.txt", b"x"),
                purpose="user_data",
                expires_after={"anchor": "created_at", "seconds": seconds},
            )
        assert exc.value.param == "expires_after.seconds" and str(seconds) in exc.value.message
    wrong_anchor: Any = {"anchor": "last_used_at", "seconds": 3600}
    with pytest.raises(openai.BadRequestError) as exc:
        sclient.files.create(
            file=("a.txt", b"x"),
            purpose="user_data",
            expires_after=wrong_anchor,
        )
    assert exc.value.param == "expires_after.anchor"

    with httpx.Client(base_url=stateful_server.base_url) as http:
        no_file = http.post("/v1/files", data={"purpose": "user_data"})
        assert no_file.status_code == 400
        assert _error(no_file)["param"] == "file"
        assert _error(no_file)["code"] == "missing_required_parameter"
        no_purpose = http.post("/v1/files", files={"file": ("a.txt", b"x")})
        assert no_purpose.status_code == 400 and _error(no_purpose)["param"] == "purpose"
        not_a_file = http.post("/v1/files", data={"purpose": "user_data", "file": "text"})
        assert not_a_file.status_code == 400 and _error(not_a_file)["param"] == "file"
        as_json = http.post("/v1/files", json={"purpose": "user_data", "file": "x"})
        assert as_json.status_code == 400 and _error(as_json)["code"] == "invalid_content_type"
    assert _ids(sclient) == before


def test_expires_after_sets_expires_at(sclient: openai.OpenAI) -> None:
    hour = _strict(
        sclient.files.create(
            file=("a.txt", b"x"),
            purpose="user_data",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
    )
    assert hour.expires_at == hour.created_at + 3600
    assert sclient.files.retrieve(hour.id).expires_at == hour.expires_at
    batch = _strict(sclient.files.create(file=("b.jsonl", b"{}\n"), purpose="batch"))
    assert batch.expires_at == batch.created_at + 2592000  # OpenAI's default for batch files
    for f in (hour, batch):
        sclient.files.delete(f.id)


# -- limits and restarts: dedicated servers --------------------------------------------------


def _start(tmp_path: Path, *extra: str) -> RespdServer:
    return start_server(
        tmp_path,
        "--data-dir",
        str(tmp_path / "data"),
        "--ctx-size",
        "512",
        "--threads",
        "2",
        *extra,
    )


def _file_rows(tmp_path: Path) -> int:
    conn = sqlite3.connect(tmp_path / "data" / "respd.sqlite3")
    try:
        return int(conn.execute("SELECT count(*) FROM files").fetchone()[0])
    finally:
        conn.close()


def _raw_upload(port: int, length_header: bytes, body: bytes) -> bytes:
    """POST /v1/files by hand, leaving the body unfinished; the answer the server sends."""
    boundary = b"respdtestboundary"
    head = (
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary="
        + boundary
        + b"\r\n"
        + length_header
        + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer


def test_upload_over_max_file_bytes_is_413_and_stores_nothing(tmp_path: Path) -> None:
    server = _start(tmp_path, "--max-file-bytes", "1024")
    try:
        client = server.client()
        for size in (1025, 300_000):  # just over: read and measured; far over: refused unread
            with pytest.raises(openai.APIStatusError) as exc:
                client.files.create(file=("big.bin", b"\x01" * size), purpose="user_data")
            assert exc.value.status_code == 413
            assert exc.value.code == "file_too_large" and exc.value.param == "file"
            assert "1024 bytes" in exc.value.message
        # The server stops reading at the limit: a body announced (or streamed) far past it
        # is answered at once, without waiting for the rest of it.
        announced = _raw_upload(server.port, b"Content-Length: 1000000000\r\n", b"")
        assert announced.startswith(b"HTTP/1.1 413 ") and b"file_too_large" in announced
        chunk = b"\x03" * 100_000
        streamed = _raw_upload(
            server.port, b"Transfer-Encoding: chunked\r\n", b"%x\r\n%s\r\n" % (len(chunk), chunk)
        )
        assert streamed.startswith(b"HTTP/1.1 413 ") and b"file_too_large" in streamed
        assert client.files.list().data == []
        assert _file_rows(tmp_path) == 0
        exact = client.files.create(file=("ok.bin", b"\x02" * 1024), purpose="user_data")
        assert exact.bytes == 1024
        assert [f.id for f in client.files.list()] == [exact.id] and _file_rows(tmp_path) == 1
    finally:
        server.stop()
    server.assert_no_5xx()


def test_files_survive_a_restart_on_sqlite(tmp_path: Path) -> None:
    first = _start(tmp_path)
    client = first.client()
    text = _strict(client.files.create(file=("notes.txt", TEXT, "text/plain"), purpose="user_data"))
    blob = _strict(client.files.create(file=("blob.bin", BINARY), purpose="vision"))
    gone = client.files.create(file=("gone.txt", b"bye"), purpose="user_data")
    client.files.delete(gone.id)
    first.process.send_signal(signal.SIGKILL)  # no chance to clean up: the writes were committed
    first.process.wait(timeout=30)

    second = _start(tmp_path)
    try:
        client = second.client()
        assert _strict(client.files.retrieve(text.id)) == text
        assert _strict(client.files.retrieve(blob.id)) == blob
        assert client.files.content(text.id).read() == TEXT
        assert client.files.content(blob.id).read() == BINARY
        assert _ids(client, order="asc") == [text.id, blob.id]
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(gone.id)
    finally:
        second.stop()
    second.assert_no_5xx()
