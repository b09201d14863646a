"""One contract for every store: memory, sqlite and postgresql (a real database, see
tests/support/pg.py) must behave alike through the `Store` protocol.

Each test builds stores with a fake clock (so retention and leases are tested without
waiting) and runs its body in one event loop. Where shared and single-process stores differ
by design (a job held by another worker id is a dead process's in a single-process store),
the test says so."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from respd.store import Limits, MemoryStore, SqliteStore, StoreConfigError, open_store
from respd.store.base import (
    STAT_KEYS,
    ConversationRecord,
    FileRecord,
    ResponseRecord,
    Store,
)
from respd.store.memory import file_limits
from respd.store.migrations import MIGRATIONS
from respd.store.postgres import PostgresStore
from tests.support.pg import fresh_schema, postgres_dsn

BIG = 1 << 40
KINDS = ["memory", "sqlite", "postgresql"]


class Clock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Stores:
    """Builds stores of one kind that share one database (one file, one schema)."""

    def __init__(self, kind: str, tmp_path: Path, exits: ExitStack) -> None:
        self.kind = kind
        self.clock = Clock()
        self.path = tmp_path / "respd.sqlite3"
        self._dsn = exits.enter_context(fresh_schema()) if kind == "postgresql" else ""
        self._memory: MemoryStore | None = None

    @property
    def shared(self) -> bool:
        """Whether several processes may use the same store (leases are then honoured)."""
        return self.kind == "postgresql"

    def make(self, responses_ttl: float = 0, conversations_ttl: float = 0) -> Store:
        clock = self.clock
        if self.kind == "memory":
            if self._memory is None:  # one process, one map: a second handle is the same
                self._memory = MemoryStore(
                    Limits(BIG, BIG, responses_ttl),
                    Limits(BIG, BIG, conversations_ttl),
                    clock,
                    files=file_limits(BIG),
                    wall_clock=clock,
                )
            return self._memory
        ttls = {"responses_ttl_secs": responses_ttl, "conversations_ttl_secs": conversations_ttl}
        if self.kind == "sqlite":
            return SqliteStore(self.path, clock=clock, **ttls)
        return PostgresStore(self._dsn, clock=clock, **ttls)


@pytest.fixture(params=KINDS)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    with ExitStack() as exits:
        yield Stores(request.param, tmp_path, exits)


def run(store: Store, body: Callable[[Store], Awaitable[None]]) -> None:
    """Open `store`, run `body` against it, close it, all in one event loop."""

    async def go() -> None:
        await store.open()
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(go())


def rec(
    rid: str,
    owner: str = "alice",
    status: str = "completed",
    *,
    text: str = "x",
    background: bool = False,
    conversation_id: str | None = None,
) -> ResponseRecord:
    return ResponseRecord(
        id=rid,
        owner=owner,
        created_at=1_700_000_000,
        status=status,
        background=background,
        response={"id": rid, "status": status, "output": [{"type": "message", "text": text}]},
        input_items=[{"id": f"msg_{rid}", "type": "message", "role": "user", "content": []}],
        previous_response_id="resp_prev",
        conversation_id=conversation_id,
    )


def ev(seq: int, kind: str = "response.output_text.delta") -> dict[str, Any]:
    return {"type": kind, "sequence_number": seq}


def conv(cid: str, owner: str = "alice", **metadata: str) -> ConversationRecord:
    return ConversationRecord(cid, owner, 1_700_000_000, dict(metadata))


def item(iid: str) -> dict[str, Any]:
    return {"id": iid, "type": "message", "role": "user", "content": [{"text": iid}]}


def file_rec(
    fid: str, owner: str = "alice", expires_at: int | None = None, size: int = 3
) -> FileRecord:
    return FileRecord(
        fid, owner, 1_700_000_000, f"{fid}.txt", "user_data", size, "text/plain", expires_at
    )


# -- responses -------------------------------------------------------------------------------


def test_response_round_trip_update_and_delete(stores: Stores) -> None:
    async def body(store: Store) -> None:
        record = rec("r1", conversation_id="conv_1")
        assert await store.save_response(record, events=[ev(0), ev(1)])
        assert await store.get_response("alice", "r1") == record
        assert await store.get_response("alice", "nope") is None
        updated = rec("r1", text="y", conversation_id="conv_1")
        await store.save_response(updated)
        assert await store.get_response("alice", "r1") == updated
        assert [e["sequence_number"] for e in await store.read_events("alice", "r1", -1)] == [0, 1]
        assert await store.delete_response("alice", "r1")
        assert await store.get_response("alice", "r1") is None
        assert await store.read_events("alice", "r1", -1) == []
        assert not await store.delete_response("alice", "r1")

    run(stores.make(), body)


def test_finished_record_is_never_replaced_by_unfinished(stores: Stores) -> None:
    """A late progress write (racing a cancellation) cannot resurrect a finished job."""

    async def body(store: Store) -> None:
        await store.save_response(rec("r", status="cancelled"))
        await store.save_response(rec("r", status="in_progress", text="late"))
        got = await store.get_response("alice", "r")
        assert got is not None and got.status == "cancelled" and got.output[0]["text"] == "x"
        await store.save_response(rec("r", status="failed"))
        got = await store.get_response("alice", "r")
        assert got is not None and got.status == "failed"

    run(stores.make(), body)


def test_events_are_ordered_filtered_and_rewritable(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.save_response(rec("r", "alice", "in_progress"), events=[ev(2), ev(0)])
        await store.save_response(rec("r", "alice", "in_progress"), events=[ev(1), ev(3)])
        assert [e["sequence_number"] for e in await store.read_events("alice", "r", -1)] == [
            0,
            1,
            2,
            3,
        ]
        assert [e["sequence_number"] for e in await store.read_events("alice", "r", 1)] == [2, 3]
        assert await store.read_events("alice", "r", 3) == []
        # The same sequence number written again replaces the event (a replayed flush).
        await store.save_response(rec("r"), events=[ev(3, "response.completed")])
        events = await store.read_events("alice", "r", 2)
        assert [e["type"] for e in events] == ["response.completed"]

    run(stores.make(), body)


def test_a_failed_write_leaves_nothing_behind(stores: Stores) -> None:
    """A write that fails half-way (a bad event) stores no part of itself: not the record,
    not the conversation turn, not the other events."""

    async def body(store: Store) -> None:
        await store.create_conversation(conv("c"), [])
        with pytest.raises(KeyError):
            await store.save_response(
                rec("r", conversation_id="c"),
                conversation=("c", [item("msg_in")]),
                events=[ev(0), {"no": "sequence number"}],
            )
        assert await store.get_response("alice", "r") is None
        assert await store.conversation_items("alice", "c") == []

    run(stores.make(), body)


def test_a_turn_joins_its_conversation_in_the_same_write(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.create_conversation(conv("c"), [item("msg_0")])
        await store.save_response(
            rec("r", conversation_id="c"),
            conversation=("c", [item("msg_in"), item("msg_out")]),
            events=[ev(0)],
        )
        items = await store.conversation_items("alice", "c")
        assert [i["id"] for i in items or []] == ["msg_0", "msg_in", "msg_out"]
        # A conversation that is gone, or another owner's, is skipped; the response stays.
        await store.save_response(rec("r2"), conversation=("gone", [item("x")]))
        await store.create_conversation(conv("theirs", "bob"), [])
        await store.save_response(rec("r3"), conversation=("theirs", [item("x")]))
        assert await store.conversation_items("bob", "theirs") == []
        assert await store.get_response("alice", "r2") is not None
        assert await store.get_response("alice", "r3") is not None

    run(stores.make(), body)


# -- owner isolation ---------------------------------------------------------------------------


def test_another_owner_sees_nothing(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.save_response(rec("r", "alice"), events=[ev(0)])
        await store.start_job(rec("job", "alice", "in_progress", background=True), "w", 30)
        await store.create_conversation(conv("c", "alice", k="v"), [item("msg_1")])
        await store.save_file(file_rec("file-1", "alice"), b"abc")

        assert await store.get_response("bob", "r") is None
        assert await store.read_events("bob", "r", -1) == []
        assert not await store.delete_response("bob", "r")
        assert not await store.request_cancel("bob", "job")
        assert await store.get_conversation("bob", "c") is None
        assert await store.update_conversation("bob", "c", {"k": "stolen"}) is None
        assert not await store.add_conversation_items("bob", "c", [item("x")])
        assert await store.conversation_items("bob", "c") is None
        assert not await store.delete_conversation_item("bob", "c", "msg_1")
        assert not await store.delete_conversation("bob", "c")
        assert await store.get_file("bob", "file-1") is None
        assert await store.file_content("bob", "file-1") is None
        assert await store.list_files("bob") == []
        assert not await store.delete_file("bob", "file-1")

        # ...and the owner's view is untouched by all of that.
        assert await store.get_response("alice", "r") is not None
        assert len(await store.read_events("alice", "r", -1)) == 1
        assert await store.cancel_requests("w") == []
        got = await store.get_conversation("alice", "c")
        assert got is not None and got.metadata == {"k": "v"}
        assert [i["id"] for i in await store.conversation_items("alice", "c") or []] == ["msg_1"]
        assert await store.file_content("alice", "file-1") == b"abc"

    run(stores.make(), body)


# -- conversations -----------------------------------------------------------------------------


def test_conversation_items_keep_insertion_order(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.create_conversation(conv("c", n="1"), [item("b"), item("a")])
        assert await store.add_conversation_items("alice", "c", [item("d"), item("c")])
        assert not await store.add_conversation_items("alice", "nope", [item("x")])
        items = await store.conversation_items("alice", "c")
        assert [i["id"] for i in items or []] == ["b", "a", "d", "c"]
        assert items is not None and items[0] == item("b")
        assert await store.delete_conversation_item("alice", "c", "a")
        assert not await store.delete_conversation_item("alice", "c", "a")
        assert [i["id"] for i in await store.conversation_items("alice", "c") or []] == [
            "b",
            "d",
            "c",
        ]
        updated = await store.update_conversation("alice", "c", {"n": "2"})
        assert updated is not None and updated.as_object()["metadata"] == {"n": "2"}
        assert await store.get_conversation("alice", "c") == updated
        assert await store.conversation_items("alice", "nope") is None
        assert await store.delete_conversation("alice", "c")
        assert await store.get_conversation("alice", "c") is None
        assert await store.conversation_items("alice", "c") is None
        assert not await store.delete_conversation("alice", "c")

    run(stores.make(), body)


# -- files -------------------------------------------------------------------------------------


def test_files_round_trip_list_and_expire(stores: Stores) -> None:
    async def body(store: Store) -> None:
        now = int(stores.clock.now)
        await store.save_file(file_rec("file-z"), b"aaa")  # upload order, not id order
        await store.save_file(file_rec("file-b", expires_at=now + 60), b"\x00\xff\x01")
        assert await store.get_file("alice", "file-z") == file_rec("file-z")
        assert await store.file_content("alice", "file-b") == b"\x00\xff\x01"
        assert [f.id for f in await store.list_files("alice")] == ["file-z", "file-b"]
        assert (await store.stats())["file_bytes"] == 6
        stores.clock.now += 60  # expires_at is exclusive: gone at that second
        assert await store.get_file("alice", "file-b") is None
        assert await store.file_content("alice", "file-b") is None
        assert not await store.delete_file("alice", "file-b")
        assert [f.id for f in await store.list_files("alice")] == ["file-z"]
        await store.purge_expired()
        assert (await store.stats())["files"] == 1
        assert await store.delete_file("alice", "file-z")
        assert await store.get_file("alice", "file-z") is None
        assert await store.list_files("alice") == []

    run(stores.make(), body)


# -- retention ---------------------------------------------------------------------------------


def test_responses_expire_a_ttl_after_their_last_write(stores: Stores) -> None:
    clock = stores.clock

    async def body(store: Store) -> None:
        await store.save_response(rec("old"), events=[ev(0)])
        clock.now += 30
        await store.save_response(rec("new"), events=[ev(0)])
        clock.now += 30
        assert await store.get_response("alice", "old") is not None  # exactly the TTL: kept
        clock.now += 1
        # Invisible at once, before any purge, to every read and write.
        assert await store.get_response("alice", "old") is None
        assert await store.read_events("alice", "old", -1) == []
        assert not await store.delete_response("alice", "old")
        assert await store.get_response("alice", "new") is not None
        await store.purge_expired()
        stats = await store.stats()
        assert stats["responses"] == 1 and stats["events"] == 1

    run(stores.make(responses_ttl=60), body)


def test_conversations_expire_a_ttl_after_their_last_write(stores: Stores) -> None:
    clock = stores.clock

    async def body(store: Store) -> None:
        await store.create_conversation(conv("c"), [item("a")])
        await store.create_conversation(conv("idle"), [item("a")])
        clock.now += 50
        assert await store.add_conversation_items("alice", "c", [item("b")])  # a write
        clock.now += 50
        await store.save_response(rec("r"), conversation=("c", [item("t")]))  # and a turn
        clock.now += 50
        assert await store.get_conversation("alice", "idle") is None
        assert not await store.add_conversation_items("alice", "idle", [item("x")])
        assert await store.conversation_items("alice", "idle") is None
        assert [i["id"] for i in await store.conversation_items("alice", "c") or []] == [
            "a",
            "b",
            "t",
        ]
        await store.purge_expired()
        assert (await store.stats())["items"] == 3
        clock.now += 61
        assert await store.get_conversation("alice", "c") is None
        await store.purge_expired()
        assert (await store.stats())["conversations"] == 0

    run(stores.make(conversations_ttl=60), body)


def test_ttl_zero_keeps_records_until_deleted(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.save_response(rec("r"))
        await store.create_conversation(conv("c"), [])
        stores.clock.now += 10**9
        assert await store.purge_expired() == 0
        assert await store.get_response("alice", "r") is not None
        assert await store.get_conversation("alice", "c") is not None

    run(stores.make(), body)


def test_store_size_stays_bounded_under_steady_writes(stores: Stores) -> None:
    """Soak: a steady stream of responses (with event logs) and conversations (with items),
    purged periodically, never holds more than the TTL's worth of them."""
    ttl, step, per_round = 60.0, 10.0, 20
    bound = int(ttl / step + 1) * per_round  # rounds whose writes are still within the TTL

    async def body(store: Store) -> None:
        peak = 0
        for round_ in range(40):
            for i in range(per_round):
                rid = f"r{round_}_{i}"
                await store.save_response(rec(rid), events=[ev(0), ev(1), ev(2)])
            await store.create_conversation(conv(f"c{round_}"), [item("a"), item("b")])
            stores.clock.now += step
            await store.purge_expired()
            stats = await store.stats()
            peak = max(peak, stats["responses"])
            assert stats["responses"] <= bound, (round_, stats)
            assert stats["events"] == 3 * stats["responses"]
            assert stats["conversations"] <= bound // per_round
            assert stats["items"] == 2 * stats["conversations"]
        assert peak >= bound - per_round  # the bound was reached: the TTL, not luck, held it
        stores.clock.now += ttl + 1
        await store.purge_expired()
        assert await store.stats() == dict.fromkeys(STAT_KEYS, 0)

    run(stores.make(responses_ttl=ttl, conversations_ttl=ttl), body)


def test_stats_count_what_the_store_holds(stores: Stores) -> None:
    async def body(store: Store) -> None:
        assert await store.stats() == dict.fromkeys(STAT_KEYS, 0)
        await store.save_response(rec("r1"), events=[ev(0), ev(1)])
        await store.save_response(rec("r2"))
        await store.create_conversation(conv("c"), [item("a"), item("b"), item("c")])
        await store.save_file(file_rec("file-1", size=5), b"12345")
        await store.save_file(file_rec("file-2", size=2), b"67")
        assert await store.stats() == {
            "responses": 2,
            "conversations": 1,
            "items": 3,
            "files": 2,
            "file_bytes": 7,
            "events": 2,
        }

    run(stores.make(), body)


def test_owner_bytes_count_files_and_responses_of_one_owner(stores: Stores) -> None:
    async def body(store: Store) -> None:
        assert await store.owner_bytes("alice") == 0
        await store.save_file(file_rec("file-1", size=5), b"12345")
        assert await store.owner_bytes("alice") == 5
        await store.save_response(rec("r1", text="y" * 1000))
        with_response = await store.owner_bytes("alice")
        assert with_response > 1005  # the response's JSON counts too
        await store.save_file(file_rec("file-2", "bob", size=2), b"67")
        await store.save_response(rec("r2", "bob"))
        assert await store.owner_bytes("alice") == with_response  # others' are their own
        await store.delete_file("alice", "file-1")
        await store.delete_response("alice", "r1")
        assert await store.owner_bytes("alice") == 0

    run(stores.make(), body)


# -- background jobs: leases, claims, cancel requests, live logs ---------------------------------


def test_a_job_is_written_only_by_its_holder(stores: Stores) -> None:
    async def body(store: Store) -> None:
        job = rec("job", status="queued", background=True)
        await store.start_job(job, "A", 30)
        assert await store.get_response("alice", "job") == job
        running = rec("job", status="in_progress", background=True, text="partial")
        assert await store.save_response(running, events=[ev(0), ev(1)], worker="A")
        assert not await store.save_response(running, events=[ev(2)], worker="B")
        assert [e["sequence_number"] for e in await store.read_events("alice", "job", -1)] == [
            0,
            1,
        ]
        got = await store.get_response("alice", "job")
        assert got is not None and got.output[0]["text"] == "partial"
        done = rec("job", status="completed", background=True, text="all")
        assert await store.save_response(done, events=[ev(2)], worker="A")
        # Finished: its holder cannot write it again either.
        assert not await store.save_response(running, worker="A")
        got = await store.get_response("alice", "job")
        assert got is not None and got.status == "completed"

    run(stores.make(), body)


def test_a_deleted_job_is_never_written_back(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.create_conversation(conv("c"), [])
        await store.start_job(rec("job", status="in_progress", background=True), "A", 30)
        assert await store.delete_response("alice", "job")
        assert await store.renew_leases("A", ["job"], 30) == ["job"]
        final = rec("job", status="completed", background=True, conversation_id="c")
        written = await store.save_response(
            final, conversation=("c", [item("out")]), events=[ev(5)], worker="A"
        )
        assert not written
        assert await store.get_response("alice", "job") is None
        assert await store.conversation_items("alice", "c") == []
        assert (await store.stats())["events"] == 0

    run(stores.make(), body)


def test_leases_are_renewed_by_their_holder_only(stores: Stores) -> None:
    async def body(store: Store) -> None:
        for rid in ("j1", "j2"):
            await store.start_job(rec(rid, status="queued", background=True), "A", 30)
        await store.save_response(rec("j2", status="completed", background=True), worker="A")
        assert await store.renew_leases("A", ["j1", "j2", "gone"], 30) == ["j2", "gone"]
        assert await store.renew_leases("B", ["j1"], 30) == ["j1"]
        assert await store.renew_leases("A", [], 30) == []

    run(stores.make(), body)


def test_a_live_lease_keeps_a_job_from_other_workers(stores: Stores) -> None:
    """Shared store: a job whose holder renews its lease is never handed to anyone else;
    single-process store: any other worker id is a process that is gone."""

    async def body(store: Store) -> None:
        await store.start_job(rec("job", status="in_progress", background=True), "A", 30)
        stores.clock.now += 20
        assert await store.renew_leases("A", ["job"], 30) == []
        stores.clock.now += 20  # 40 s after the start, 20 s after the renewal
        assert await store.claim_job("job", "A", 30) is None  # its own holder: nothing to take
        taken = await store.claim_job("job", "B", 30)
        stale = await store.claim_stale_jobs("C", 30)
        if stores.shared:
            assert taken is None and stale == []
        else:
            assert taken is not None and taken.id == "job"

    run(stores.make(), body)


def test_an_expired_lease_goes_to_exactly_one_claimer(stores: Stores) -> None:
    """Concurrent claims (from two processes, where the store is shared) of a job whose
    holder died: one wins, and the dead holder can no longer write it."""

    async def body(store: Store) -> None:
        other = stores.make()
        await other.open()
        try:
            await store.start_job(rec("job", status="in_progress", background=True), "A", 30)
            stores.clock.now += 31
            claimers = [(store, "B"), (other, "C")] if stores.shared else [(store, "B")]
            claims = await asyncio.gather(*(s.claim_job("job", w, 30) for s, w in claimers * 3))
            winners = [c for c in claims if c is not None]
            assert len(winners) == 1 and winners[0].id == "job"
            winner = claimers[claims.index(winners[0]) % len(claimers)][1]
            # The new holder writes it; the old one (back from the dead) cannot.
            assert not await store.save_response(rec("job", "alice", "completed"), worker="A")
            failed = rec("job", status="failed", background=True)
            failed_event = [ev(9, "response.failed")]
            assert await store.save_response(failed, events=failed_event, worker=winner)
            assert await store.claim_job("job", "D", 30) is None  # finished: nothing to claim
        finally:
            if other is not store:
                await other.close()

    run(stores.make(), body)


def test_stale_jobs_are_split_between_concurrent_sweepers(stores: Stores) -> None:
    async def body(store: Store) -> None:
        other = stores.make()
        await other.open()
        try:
            ids = [f"job{i}" for i in range(12)]
            for rid in ids:
                await store.start_job(rec(rid, status="queued", background=True), "dead", 5)
            await store.start_job(rec("live", status="queued", background=True), "alive", 60)
            await store.save_response(rec("done", status="completed"))
            stores.clock.now += 10
            if stores.shared:
                first, second = await asyncio.gather(
                    store.claim_stale_jobs("B", 30), other.claim_stale_jobs("C", 30)
                )
            else:  # one process: one sweeper, and every other worker's job is stale
                first, second = await store.claim_stale_jobs("B", 30), []
            got = [r.id for r in first] + [r.id for r in second]
            expected = set(ids) if stores.shared else {*ids, "live"}
            assert sorted(got) == sorted(expected)  # each stale job to exactly one sweeper
            assert all(r.status == "queued" and r.background for r in first + second)
            # Claimed jobs now hold fresh leases: sweeping again finds nothing.
            assert await store.claim_stale_jobs("B", 30) == []
        finally:
            if other is not store:
                await other.close()

    run(stores.make(), body)


def test_cancel_requests_reach_the_holder(stores: Stores) -> None:
    async def body(store: Store) -> None:
        await store.start_job(rec("j1", status="in_progress", background=True), "A", 30)
        await store.start_job(rec("j2", status="in_progress", background=True), "A", 30)
        await store.start_job(rec("j3", status="in_progress", background=True), "B", 30)
        assert await store.cancel_requests("A") == []
        assert await store.request_cancel("alice", "j1")
        assert await store.request_cancel("alice", "j3")
        assert not await store.request_cancel("alice", "nope")
        assert await store.cancel_requests("A") == ["j1"]
        assert await store.cancel_requests("B") == ["j3"]
        cancelled = rec("j1", status="cancelled", background=True)
        assert await store.save_response(cancelled, worker="A")
        assert await store.cancel_requests("A") == []
        assert not await store.request_cancel("alice", "j1")  # finished: nothing to cancel

    run(stores.make(), body)


def test_a_follower_reads_the_log_another_worker_writes(stores: Stores) -> None:
    """The event log of a running job, as another process's follower sees it: every flush
    is visible as soon as it is written, in order, and the end shows in the record."""

    async def body(store: Store) -> None:
        reader = stores.make()
        await reader.open()
        try:
            await store.start_job(rec("job", status="queued", background=True), "A", 30)
            seen: list[int] = []
            for flush in range(3):
                batch = [ev(3 * flush + i) for i in range(3)]
                status = "in_progress" if flush < 2 else "completed"
                assert await store.save_response(
                    rec("job", status=status, background=True), events=batch, worker="A"
                )
                after = seen[-1] if seen else -1
                events = await reader.read_events("alice", "job", after)
                seen += [e["sequence_number"] for e in events]
                record = await reader.get_response("alice", "job")
                assert record is not None and record.status == status
            assert seen == list(range(9))
        finally:
            if reader is not store:
                await reader.close()

    run(stores.make(), body)


# -- one store kind at a time --------------------------------------------------------------------


def test_open_store_spells_every_kind(tmp_path: Path) -> None:
    assert isinstance(open_store("memory", tmp_path), MemoryStore)
    assert isinstance(open_store("sqlite", tmp_path), SqliteStore)
    assert isinstance(open_store("sqlite:///x.db", tmp_path), SqliteStore)
    assert (tmp_path / "x.db").is_file() and (tmp_path / "respd.sqlite3").is_file()
    dsn = postgres_dsn()
    for spec in (dsn, dsn.replace("postgresql://", "postgres://", 1)):
        store = open_store(spec, tmp_path, responses=Limits(1, 1, 7))
        assert isinstance(store, PostgresStore) and store.responses_ttl == 7
    with pytest.raises(StoreConfigError, match=r"cannot connect to --store postgresql://u:\*\*\*@"):
        open_store("postgresql://u:secret@127.0.0.1:1/db", tmp_path)
    with pytest.raises(StoreConfigError, match="unknown --store"):
        open_store("mysql://db", tmp_path)


def test_sqlite_schema_is_versioned_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    async def write_then_reopen() -> None:
        store = SqliteStore(path)
        await store.save_response(rec("r"))
        await store.close()
        again = SqliteStore(path)  # migrations are idempotent
        assert await again.get_response("alice", "r") is not None
        await again.close()

    asyncio.run(write_then_reopen())
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        SqliteStore(path)


def test_sqlite_upgrade_keeps_old_rows_visible(tmp_path: Path) -> None:
    """A data dir from before retention (schema 2) upgrades: its rows count as last written
    when they were created, so they are kept, not purged at once."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (2)")
    for script in MIGRATIONS[:2]:
        conn.executescript(script)
    conn.execute(
        "INSERT INTO responses VALUES ('r', 'alice', 1700000000, 'completed', 0, NULL, NULL, "
        "'{\"id\": \"r\"}', '[]')"
    )
    conn.execute("INSERT INTO conversations VALUES ('c', 'alice', 1700000000, '{}')")
    conn.commit()
    conn.close()
    clock = Clock()
    clock.now = 1_700_000_100

    async def check() -> None:
        store = SqliteStore(path, responses_ttl_secs=3600, conversations_ttl_secs=3600, clock=clock)
        assert await store.get_response("alice", "r") is not None
        assert await store.get_conversation("alice", "c") is not None
        assert await store.purge_expired() == 0
        clock.now += 3600
        assert await store.get_response("alice", "r") is None
        await store.close()

    asyncio.run(check())


def test_sqlite_files_are_private(tmp_path: Path) -> None:
    """The database and its -wal/-shm files are 0600, in a 0700 directory respd made."""
    directory = tmp_path / "fresh" / "data"

    async def write() -> None:
        store = SqliteStore(directory / "respd.sqlite3")
        await store.save_response(rec("r"))
        modes = {
            name: stat.S_IMODE(os.stat(directory / name).st_mode)
            for name in ("respd.sqlite3", "respd.sqlite3-wal", "respd.sqlite3-shm")
        }
        await store.close()
        assert modes == dict.fromkeys(modes, 0o600)

    old_umask = os.umask(0o022)  # a usual umask, which would give 0644 and 0755
    try:
        asyncio.run(write())
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_postgres_schema_is_versioned_and_migrated_once() -> None:
    """Replicas that start together migrate once; a newer schema is refused."""
    from respd.store.migrations import POSTGRES_MIGRATIONS

    with fresh_schema() as dsn:

        async def start_three() -> None:
            stores = [PostgresStore(dsn) for _ in range(3)]
            await asyncio.gather(*(s.open() for s in stores))
            await stores[0].save_response(rec("r"))
            assert await stores[2].get_response("alice", "r") is not None
            for s in stores:
                await s.close()

        asyncio.run(start_three())
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT version FROM schema_version").fetchall()
            assert row == [(len(POSTGRES_MIGRATIONS),)]
            conn.execute("UPDATE schema_version SET version = 99")

        async def refuse() -> None:
            with pytest.raises(RuntimeError, match="newer"):
                await PostgresStore(dsn).open()

        asyncio.run(refuse())
