"""Uploaded bytes come back as downloads that a browser neither sniffs nor runs: every
file's content carries `nosniff`, a sandboxing CSP and `attachment`, HTML and SVG first."""

from __future__ import annotations

import httpx
import pytest

ACTIVE = [
    ("page.html", b"<script>alert(1)</script>", "text/html"),
    ("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>", "image/svg+xml"),
    ("page.xhtml", b"<html xmlns='http://www.w3.org/1999/xhtml'/>", "application/xhtml+xml"),
    ("notes.txt", b"<html><script>alert(1)</script></html>", "text/plain"),
    ("blob", b"<svg onload='alert(1)'/>", "application/octet-stream"),
]


@pytest.mark.parametrize(("name", "data", "mime"), ACTIVE)
async def test_file_content_is_never_sniffed_or_rendered(
    http: httpx.AsyncClient, name: str, data: bytes, mime: str
) -> None:
    made = await http.post(
        "/v1/files", files={"file": (name, data, mime)}, data={"purpose": "user_data"}
    )
    assert made.status_code == 200, made.text
    r = await http.get(f"/v1/files/{made.json()['id']}/content")
    assert r.status_code == 200
    assert r.content == data
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-disposition"].startswith("attachment;")
    assert "sandbox" in r.headers["content-security-policy"]
    assert "default-src 'none'" in r.headers["content-security-policy"]
