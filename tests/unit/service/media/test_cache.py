"""The media cache (`service/media/cache.py`) and how the resolver uses it: LRU by bytes,
keys by source, hits and misses, stored files still looked up on every use (a deleted one
stays a 404), remote URLs only while remote fetching is on, errors never kept."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import pytest
from PIL import Image as PILImage

from respd.engines.base import Image
from respd.protocol.errors import APIError
from respd.service.files import FilesService
from respd.service.media import resolver as resolver_module
from respd.service.media.cache import MediaCache, entry_bytes
from respd.service.media.resolver import FileText, MediaResolver, MediaSettings
from respd.store import MemoryStore
from respd.store.base import FileRecord


def png(color: str = "red", size: tuple[int, int] = (32, 32)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def counting_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every image decode and document extraction the resolver runs."""
    seen: list[str] = []
    check, text = resolver_module.check_image, resolver_module.document_text

    def check_image(data: bytes, declared: str, param: str, settings: MediaSettings) -> Any:
        seen.append(param)
        return check(data, declared, param, settings)

    def document_text(data: bytes, mime: str, filename: str, param: str) -> FileText:
        seen.append(param)
        return text(data, mime, filename, param)

    monkeypatch.setattr(resolver_module, "check_image", check_image)
    monkeypatch.setattr(resolver_module, "document_text", document_text)
    return seen


# -- the LRU ----------------------------------------------------------------------------------


def test_the_cache_is_an_lru_bounded_by_bytes() -> None:
    cache = MediaCache(250)
    a, b, c = (Image(bytes(100), "image/png") for _ in range(3))
    cache.put(("k", "a"), a)
    cache.put(("k", "b"), b)
    assert cache.get(("k", "a")) is a  # a is now the most recently used
    cache.put(("k", "c"), c)  # 300 bytes: b goes
    assert cache.get(("k", "b")) is None
    assert cache.get(("k", "a")) is a and cache.get(("k", "c")) is c
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.bytes, stats.entries) == (3, 1, 200, 2)
    cache.put(("k", "huge"), Image(bytes(251)))  # larger than the budget: not kept
    assert cache.get(("k", "huge")) is None and cache.stats().bytes == 200
    cache.put(("k", "a"), Image(bytes(10)))  # replacing an entry replaces its size
    assert cache.stats().bytes == 110


def test_a_zero_budget_disables_the_cache() -> None:
    cache = MediaCache(0)
    cache.put(("k",), Image(b"x"))
    assert cache.get(("k",)) is None
    assert (cache.stats().entries, cache.stats().misses) == (0, 1)


def test_document_entries_count_their_text() -> None:
    small, large = FileText("a.txt", "x"), FileText("a.txt", "x" * 10_000)
    assert entry_bytes(large) - entry_bytes(small) == 9_999


# -- the resolver ------------------------------------------------------------------------------


def test_a_replayed_data_url_image_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting_checks(monkeypatch)
    resolver = MediaResolver(MemoryStore())
    items = [user({"type": "input_image", "image_url": data_uri(png())})]

    async def twice() -> tuple[Any, Any]:
        first = await resolver.resolve_items(items, "owner")
        return first, await resolver.resolve_items(items, "someone-else")  # content-addressed

    first, second = asyncio.run(twice())
    assert first["input[0].content[0]"] is second["input[0].content[0]"]
    assert seen == ["input[0].content[0].image_url"]
    stats = resolver.cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    assert stats.bytes == len(png())


def test_chat_and_responses_spellings_share_an_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting_checks(monkeypatch)
    resolver = MediaResolver(MemoryStore())
    url = data_uri(png("blue"))

    async def both() -> None:
        await resolver.resolve_items([user({"type": "input_image", "image_url": url})], "o")
        chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
        await resolver.resolve_messages(chat, "o")

    asyncio.run(both())
    assert len(seen) == 1 and resolver.cache.stats().hits == 1


def test_errors_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver = MediaResolver(MemoryStore())
    items = [user({"type": "input_image", "image_url": "data:image/png;base64,AAAA"})]
    for _ in range(2):
        with pytest.raises(APIError) as exc:
            asyncio.run(resolver.resolve_items(items, "owner"))
        assert exc.value.code == "invalid_image"
    assert resolver.cache.stats().entries == 0 and resolver.cache.stats().misses == 2


def test_documents_are_kept_by_data_and_name(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting_checks(monkeypatch)
    resolver = MediaResolver(MemoryStore())
    data = data_uri(b"remember the milk\n", "text/plain")

    def part(name: str) -> dict[str, Any]:
        return {"type": "input_file", "file_data": data, "filename": name}

    async def go() -> list[Any]:
        return [
            (await resolver.resolve_items([user(part(name))], "o"))["input[0].content[0]"]
            for name in ("a.txt", "a.txt", "b.txt")
        ]

    a, again, b = asyncio.run(go())
    assert a is again and a.filename == "a.txt" and b.filename == "b.txt"
    assert len(seen) == 2


async def _save(store: MemoryStore, fid: str, owner: str, data: bytes, created: int = 0) -> None:
    record = FileRecord(fid, owner, created, "red.png", "vision", len(data), "image/png")
    await store.save_file(record, data)


def test_a_stored_file_is_looked_up_on_every_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached or not, a deleted file, or another owner's, is a 404 naming the part."""
    seen = counting_checks(monkeypatch)
    store = MemoryStore()
    resolver = MediaResolver(store)
    files = FilesService(store, media_cache=resolver.cache)
    items = [user({"type": "input_image", "file_id": "file-red"})]

    async def go() -> tuple[APIError, APIError]:
        await _save(store, "file-red", "owner", png())
        await resolver.resolve_items(items, "owner")
        await resolver.resolve_items(items, "owner")
        try:
            await resolver.resolve_items(items, "intruder")
        except APIError as exc:
            other = exc
        await files.delete("owner", "file-red")
        assert resolver.cache.stats().entries == 0  # deleting drops what was decoded
        try:
            await resolver.resolve_items(items, "owner")
        except APIError as exc:
            return other, exc
        raise AssertionError("a deleted file resolved")

    other, deleted = asyncio.run(go())
    assert len(seen) == 1 and resolver.cache.stats().hits == 1
    for exc in (other, deleted):
        assert (exc.status_code, exc.param) == (404, "input[0].content[0].file_id")


def test_a_file_id_names_only_the_bytes_that_were_decoded() -> None:
    """A record under the same id with other bytes (a store shared by replicas that one of
    them rewrote) is decoded again, not answered from the cache."""
    store = MemoryStore()
    resolver = MediaResolver(store)
    items = [user({"type": "input_image", "file_id": "file-x"})]

    async def go() -> tuple[Any, Any]:
        await _save(store, "file-x", "owner", png("red"), created=1)
        first = (await resolver.resolve_items(items, "owner"))["input[0].content[0]"]
        await store.delete_file("owner", "file-x")  # behind the cache's back
        await _save(store, "file-x", "owner", png("blue", (40, 40)), created=2)
        return first, (await resolver.resolve_items(items, "owner"))["input[0].content[0]"]

    first, second = asyncio.run(go())
    assert first.data == png("red") and second.data == png("blue", (40, 40))
    assert resolver.cache.stats().hits == 0


def remote_resolver(
    monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[MediaResolver, list[str]]:
    """A resolver with remote media allowed and its fetches recorded: a URL serves a red
    image, then a blue one (what a URL names can change), then a green one."""
    fetched: list[str] = []

    async def fetch_remote(url: str, param: str, **_: Any) -> tuple[bytes, str, str]:
        fetched.append(url)
        return png(["red", "blue", "green"][min(len(fetched), 3) - 1]), "image/png", url

    monkeypatch.setattr(resolver_module, "fetch_remote", fetch_remote)
    resolver = MediaResolver(MemoryStore(), MediaSettings(allow_remote_media=True, **settings))
    return resolver, fetched


def test_remote_images_are_fetched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver, fetched = remote_resolver(monkeypatch)
    items = [user({"type": "input_image", "image_url": "https://example.com/red.png"})]

    async def go() -> None:
        for _ in range(3):
            await resolver.resolve_items(items, "owner")

    asyncio.run(go())
    assert fetched == ["https://example.com/red.png"]
    assert resolver.cache.stats().hits == 2


def test_a_remote_url_is_fetched_again_once_its_entry_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolver, fetched = remote_resolver(monkeypatch, url_cache_ttl_secs=60)
    now = [1000.0]
    resolver.cache.clock = lambda: now[0]
    url = "https://example.com/today.png"
    items = [user({"type": "input_image", "image_url": url})]

    async def image() -> bytes:
        resolved = (await resolver.resolve_items(items, "owner"))["input[0].content[0]"]
        assert isinstance(resolved, Image)
        return resolved.data

    assert asyncio.run(image()) == png("red")
    now[0] += 59
    assert asyncio.run(image()) == png("red")  # still fresh
    now[0] += 1
    assert asyncio.run(image()) == png("blue")  # expired: fetched again
    assert fetched == [url, url]
    # Stored files and data URLs do not expire.
    resolver.cache.put(("data", "x"), Image(b"x"))
    now[0] += 10**6
    assert resolver.cache.get(("data", "x")) is not None


def test_a_zero_url_ttl_fetches_on_every_use(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver, fetched = remote_resolver(monkeypatch, url_cache_ttl_secs=0)
    items = [user({"type": "input_image", "image_url": "https://example.com/red.png"})]
    for _ in range(2):
        asyncio.run(resolver.resolve_items(items, "owner"))
    assert len(fetched) == 2 and resolver.cache.stats().entries == 0


def test_a_cached_remote_url_is_refused_when_fetching_is_off() -> None:
    url = "https://example.com/red.png"
    resolver = MediaResolver(MemoryStore())
    resolver.cache.put(("url", "image", url), Image(png(), "image/png"))
    with pytest.raises(APIError) as exc:
        asyncio.run(resolver.resolve_items([user({"type": "input_image", "image_url": url})], "o"))
    assert exc.value.code == "remote_media_disabled"
    doc = {"type": "input_file", "file_url": "https://example.com/notes.txt"}
    with pytest.raises(APIError) as exc:
        asyncio.run(resolver.resolve_items([user(doc)], "o"))
    assert exc.value.code == "remote_media_disabled"


def test_without_a_cache_every_use_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting_checks(monkeypatch)
    resolver = MediaResolver(MemoryStore(), MediaSettings(cache_bytes=0))
    items = [user({"type": "input_image", "image_url": data_uri(png())})]

    async def go() -> None:
        for _ in range(2):
            await resolver.resolve_items(items, "owner")

    asyncio.run(go())
    assert len(seen) == 2 and resolver.cache.stats().misses == 2
