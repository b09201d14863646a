"""The memory store's own bounds, without a model: eviction by entries, bytes and TTL exactly
as its flags say (0 included). What every store does alike is in test_store_contract.py."""

from __future__ import annotations

import asyncio
from typing import Any

from respd.store import Limits, MemoryStore
from respd.store.base import ConversationRecord, ResponseRecord, Store

BIG = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(
    rid: str, owner: str = "anon", text: str = "x", status: str = "completed"
) -> ResponseRecord:
    return ResponseRecord(
        id=rid,
        owner=owner,
        created_at=1,
        status=status,
        background=False,
        response={"id": rid, "status": status, "output": [{"type": "message", "text": text}]},
        input_items=[{"id": f"msg_{rid}", "type": "message", "role": "user", "content": []}],
    )


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _ids(store: Store, ids: list[str]) -> list[str]:
    return [i for i in ids if await store.get_response("anon", i) is not None]


def _responses(limits: Limits, clock: Clock | None = None) -> MemoryStore:
    return MemoryStore(responses=limits, conversations=Limits(BIG, BIG, 0), clock=clock or Clock())


def test_evicts_oldest_beyond_max_entries() -> None:
    store = _responses(Limits(max_entries=2, max_bytes=BIG, ttl_secs=0))

    async def go() -> None:
        for rid in ("a", "b", "c"):
            await store.save_response(_record(rid))
        assert await _ids(store, ["a", "b", "c"]) == ["b", "c"]
        await store.save_response(_record("b"))  # a write makes it the newest
        await store.save_response(_record("d"))
        assert await _ids(store, ["b", "c", "d"]) == ["b", "d"]

    _run(go())


def test_max_entries_zero_disables_storage() -> None:
    store = _responses(Limits(max_entries=0, max_bytes=BIG, ttl_secs=0))

    async def go() -> None:
        await store.save_response(_record("a"))
        assert await store.get_response("anon", "a") is None

    _run(go())


def test_evicts_oldest_beyond_max_bytes() -> None:
    one = _record("a", text="y" * 1000).approx_bytes()
    store = _responses(Limits(max_entries=BIG, max_bytes=2 * one + 10, ttl_secs=0))

    async def go() -> None:
        for rid in ("a", "b"):
            await store.save_response(_record(rid, text="y" * 1000))
        assert await _ids(store, ["a", "b"]) == ["a", "b"]
        await store.save_response(_record("c", text="y" * 1000))
        assert await _ids(store, ["a", "b", "c"]) == ["b", "c"]
        assert store.responses.bytes <= 2 * one + 10
        # One entry bigger than the whole budget is evicted at once.
        await store.save_response(_record("huge", text="z" * 5000))
        assert await _ids(store, ["b", "c", "huge"]) == []

    _run(go())


def test_max_bytes_zero_evicts_immediately() -> None:
    store = _responses(Limits(max_entries=BIG, max_bytes=0, ttl_secs=0))

    async def go() -> None:
        await store.save_response(_record("a"))
        assert await store.get_response("anon", "a") is None

    _run(go())


def test_background_event_logs_count_toward_bytes() -> None:
    base = _record("a").approx_bytes()
    store = _responses(Limits(max_entries=BIG, max_bytes=base + 200, ttl_secs=0))

    async def go() -> None:
        await store.save_response(_record("a"))
        pad = [{"sequence_number": 0, "type": "t", "pad": "p" * 500}]
        await store.save_response(_record("a"), events=pad)
        assert await store.get_response("anon", "a") is None

    _run(go())


def test_ttl_expires_and_zero_disables_it() -> None:
    clock = Clock()
    store = _responses(Limits(max_entries=BIG, max_bytes=BIG, ttl_secs=60), clock)
    forever = _responses(Limits(max_entries=BIG, max_bytes=BIG, ttl_secs=0), clock)

    async def go() -> None:
        await store.save_response(_record("a"))
        await forever.save_response(_record("a"))
        clock.now += 30
        await store.save_response(_record("b"))
        clock.now += 30
        assert await _ids(store, ["a", "b"]) == ["a", "b"]  # exactly 60 s: still kept
        clock.now += 1
        assert await _ids(store, ["a", "b"]) == ["b"]
        clock.now += 30
        assert await _ids(store, ["a", "b"]) == []
        clock.now += 10**6
        assert await _ids(forever, ["a"]) == ["a"]

    _run(go())


def test_conversation_limits() -> None:
    clock = Clock()
    store = MemoryStore(
        responses=Limits(BIG, BIG, 0), conversations=Limits(2, BIG, 10), clock=clock
    )
    disabled = MemoryStore(conversations=Limits(0, BIG, 0))

    async def go() -> None:
        for cid in ("c1", "c2", "c3"):
            await store.create_conversation(ConversationRecord(cid, "anon", 1), [])
        assert await store.get_conversation("anon", "c1") is None
        assert await store.get_conversation("anon", "c3") is not None
        clock.now += 11
        assert await store.get_conversation("anon", "c3") is None
        await disabled.create_conversation(ConversationRecord("c", "anon", 1), [])
        assert await disabled.get_conversation("anon", "c") is None

    _run(go())


def test_conversation_bytes_grow_with_items() -> None:
    store = MemoryStore(conversations=Limits(BIG, 600, 0))

    async def go() -> None:
        await store.create_conversation(ConversationRecord("c", "anon", 1), [])
        item = {"id": "msg_1", "type": "message", "role": "user", "content": "x" * 700}
        assert await store.add_conversation_items("anon", "c", [item])
        assert await store.get_conversation("anon", "c") is None  # grew past the budget

    _run(go())
