"""Two respd replicas sharing one PostgreSQL database: whatever one creates, the other
retrieves, chains, deletes, cancels and follows live; a replica killed mid-job leaves that
job `failed` within its lease."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.pg import fresh_schema
from tests.support.servers import RespdServer, start_server
from tests.support.stateful import (
    LONG_PROMPT,
    create,
    engine_stats,
    leave_background_stream,
    poll,
    strict,
    strict_event,
)

LEASE = 2  # seconds: short, so that a dead replica's job fails quickly


def _pair(tmp_path: Path, dsn: str) -> tuple[RespdServer, RespdServer]:
    args = ["--store", dsn, "--job-lease-secs", str(LEASE), "--threads", "1", "--ctx-size", "2048"]
    first = start_server(tmp_path, *args)
    try:
        return first, start_server(tmp_path, *args)
    except BaseException:
        first.stop()
        raise


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RespdServer, RespdServer]]:
    with fresh_schema() as dsn:
        a, b = _pair(tmp_path_factory.mktemp("replicas"), dsn)
        yield a, b
        for server in (a, b):
            server.stop()
            server.assert_no_5xx()


def _unparsed(value: Any) -> Any:
    """`value` as plain data, less the `parsed` and `snapshot` fields the SDK adds to what it
    streamed (at any depth)."""
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, dict):
        return {k: _unparsed(v) for k, v in value.items() if k not in ("parsed", "snapshot")}
    if isinstance(value, list):
        return [_unparsed(v) for v in value]
    return value


def test_state_is_shared_between_replicas(replicas: tuple[RespdServer, RespdServer]) -> None:
    a, b = (server.client() for server in replicas)
    created = create(a, "My name is Ada.", metadata={"by": "a"})
    assert strict(b.responses.retrieve(created.id)).model_dump() == created.model_dump()
    # Chained through B: A's turn is replayed into B's prompt.
    chained = create(b, "What is my name?", previous_response_id=created.id)
    assert chained.usage is not None and created.usage is not None
    assert chained.usage.input_tokens > created.usage.input_tokens
    assert strict(a.responses.retrieve(chained.id)).model_dump() == chained.model_dump()
    assert [i.id for i in b.responses.input_items.list(created.id)] == [
        i.id for i in a.responses.input_items.list(created.id)
    ]
    # A conversation made through A takes a turn through B.
    conv = a.conversations.create()
    turn = create(b, "Hello.", conversation=conv.id)
    items = a.conversations.items.list(conv.id, order="asc").data
    assert len(items) == 2 and items[-1].id == turn.output[0].id
    # Deleted through B: gone for A too.
    b.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        create(a, "Again?", previous_response_id=created.id)


def test_a_job_on_one_replica_is_cancelled_through_the_other(
    replicas: tuple[RespdServer, RespdServer],
) -> None:
    server_a, _ = replicas
    a, b = (server.client() for server in replicas)
    before = engine_stats(server_a.base_url)
    queued = create(a, LONG_PROMPT, background=True, max_output_tokens=1500)
    # B sees A's progress through the store (the snapshot A flushes as it generates).
    running = poll(b, queued.id, lambda r: len(r.output_text) > 10)
    assert running.status == "in_progress"
    cancelled = strict(b.responses.cancel(queued.id))
    assert cancelled.status == "cancelled"
    assert cancelled.output_text.startswith(running.output_text)
    assert cancelled.usage is not None and 0 < cancelled.usage.output_tokens < 1500
    # A's generation really stopped: its engine counted a cancellation and runs nothing.
    deadline = time.monotonic() + 30
    stats = engine_stats(server_a.base_url)
    while stats["running"] or stats["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
        stats = engine_stats(server_a.base_url)
    assert strict(a.responses.retrieve(queued.id)).model_dump() == cancelled.model_dump()
    # Cancelling again, through either replica, returns it unchanged.
    assert strict(a.responses.cancel(queued.id)).model_dump() == cancelled.model_dump()


def test_a_stream_on_one_replica_is_followed_live_through_the_other(
    replicas: tuple[RespdServer, RespdServer],
) -> None:
    a, b = (server.client() for server in replicas)
    seen = leave_background_stream(a, 4, max_output_tokens=200)  # the job carries on in A
    response_id = seen[0].response.id
    assert strict(b.responses.retrieve(response_id)).status == "in_progress"  # still live
    with b.responses.stream(response_id=response_id, starting_after=4) as followed:
        rest = [strict_event(e) for e in followed]
    assert [e.sequence_number for e in rest] == list(range(5, 5 + len(rest)))
    assert rest[-1].type in ("response.completed", "response.incomplete")
    deltas = [e for e in rest if e.type == "response.output_text.delta"]
    assert len(deltas) > 10  # most of the generation came through the follow
    stored = strict(a.responses.retrieve(response_id))
    assert _unparsed(strict(rest[-1].response)) == _unparsed(stored)
    # What B followed is exactly A's own log of the stream.
    replay = [strict_event(e) for e in a.responses.retrieve(response_id, stream=True)]
    assert [_unparsed(e) for e in replay[5:]] == [_unparsed(e) for e in rest]
    assert [e.to_dict() for e in replay[:5]] == [e.to_dict() for e in seen]


def test_a_killed_replicas_job_fails_within_its_lease(tmp_path: Path) -> None:
    with fresh_schema() as dsn:
        server_a, server_b = _pair(tmp_path, dsn)
        try:
            a, b = server_a.client(), server_b.client()
            queued = create(a, LONG_PROMPT, background=True, max_output_tokens=1500)
            poll(b, queued.id, lambda r: len(r.output_text) > 0)
            server_a.process.send_signal(signal.SIGKILL)
            server_a.process.wait(timeout=30)
            killed = time.monotonic()
            failed = poll(b, queued.id, lambda r: r.status != "in_progress", timeout=30)
            waited = time.monotonic() - killed
            assert failed.status == "failed" and failed.error is not None
            assert "stopped" in failed.error.message
            # The lease (2 s) runs out, then B's sweep (every lease/2) records the failure.
            assert waited < 2 * LEASE + 1, waited
            events = [strict_event(e) for e in b.responses.retrieve(queued.id, stream=True)]
            assert events[0].type == "response.created" and events[-1].type == "response.failed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
        finally:
            server_a.stop()
            server_b.stop()
        server_b.assert_no_5xx()
