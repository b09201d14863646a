"""The playground's static page: served at `/` with its assets, typed and revalidated, out of
the API description, open without a key, gone with --no-ui, and self-contained (no asset
names another host)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib.resources import files

import httpx
import pytest
from fastapi import FastAPI

from respd.api.app import create_app
from respd.api.identity import KeyRing
from respd.cli import build_parser, settings_from_args
from respd.engines.fake import FakeEngine
from respd.store import MemoryStore

ASSETS = files("respd.api") / "playground"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
# Any absolute http(s) URL; the only ones allowed are the XML namespaces of inline SVG.
URL = re.compile(r"https?://[^\s\"'`)<>]+")


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://respd.test")


def _shipped() -> list[str]:
    return sorted(p.name for p in ASSETS.iterdir() if p.name.endswith(tuple(TYPES)))


async def test_the_root_serves_the_page(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert '<script type="module" src="/playground/app.js">' in r.text
    again = await http.get("/", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and not again.content


@pytest.mark.parametrize("name", _shipped())
async def test_every_asset_loads_with_its_type(http: httpx.AsyncClient, name: str) -> None:
    r = await http.get(f"/playground/{name}")
    assert r.status_code == 200
    suffix = name[name.rindex(".") :]
    assert r.headers["content-type"].startswith(TYPES[suffix])
    assert r.headers["x-content-type-options"] == "nosniff"


async def test_every_module_the_page_imports_is_served(http: httpx.AsyncClient) -> None:
    page = (await http.get("/")).text
    wanted = set(re.findall(r'(?:src|href)="/playground/([\w.]+)"', page))
    for name in _shipped():
        if name.endswith(".js"):
            wanted |= set(re.findall(r'from "\./([\w.]+)"', (ASSETS / name).read_text()))
    assert wanted >= {"app.js", "style.css", "api.js", "render.js"}
    for name in wanted:
        assert (await http.get(f"/playground/{name}")).status_code == 200, name


@pytest.mark.parametrize("path", ["/playground/nope.js", "/playground/../app.py", "/playground/"])
async def test_unknown_assets_are_404s(http: httpx.AsyncClient, path: str) -> None:
    r = await http.get(path)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_the_page_is_not_in_the_api_description(http: httpx.AsyncClient) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith("/playground")]


async def test_the_page_loads_without_a_key_and_the_api_still_asks(engine: FakeEngine) -> None:
    app = create_app(engine, MemoryStore(), keys=KeyRing(["sk-right"]))
    async with _client(app) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/playground/app.js")).status_code == 200
        refused = await http.get("/v1/models")
        assert refused.status_code == 401 and refused.json()["error"]["message"]


async def test_no_ui_answers_404_in_openais_shape(engine: FakeEngine) -> None:
    settings = settings_from_args(build_parser().parse_args(["serve", "--no-ui"]))
    assert settings.no_ui
    app = create_app(engine, MemoryStore(), ui=not settings.no_ui)
    async with _client(app) as http:
        for path in ("/", "/playground/app.js"):
            r = await http.get(path)
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "unknown_url"


def test_no_asset_reaches_another_host() -> None:
    for name in _shipped():
        text = (ASSETS / name).read_text()
        found = [u for u in URL.findall(text) if not u.startswith("http://www.w3.org/")]
        assert not found, f"{name} names other hosts: {found}"
        assert "//cdn" not in text and "@import url(" not in text, name


class _Controls(HTMLParser):
    """The page's form controls, and which of them a label names or wraps."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[str] = []
        self.labelled: set[str] = set()
        self.in_label = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "label":
            self.in_label += 1
            if named.get("for"):
                self.labelled.add(str(named["for"]))
        elif tag in ("input", "select", "textarea"):
            control = str(named.get("id"))
            self.controls.append(control)
            if self.in_label or named.get("aria-label"):
                self.labelled.add(control)

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self.in_label -= 1


def test_every_control_on_the_page_has_a_label() -> None:
    parser = _Controls()
    parser.feed((ASSETS / "index.html").read_text())
    assert len(parser.controls) > 10
    assert not set(parser.controls) - parser.labelled
