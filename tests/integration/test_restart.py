"""State survives a restart on the same data dir (SIGTERM and SIGKILL). A background job the
shutdown drain interrupts is stored `incomplete`; one running when the process died comes
back `failed`; none stays in progress."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import openai
import pytest

from tests.support.servers import MODEL_ID, RespdServer, start_server
from tests.support.stateful import LONG_PROMPT, create, strict

COUNT = {
    "type": "json_schema",
    "name": "count",
    "schema": {
        "type": "object",
        "properties": {"n": {"type": "array", "items": {"type": "integer"}, "minItems": 400}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "strict": True,
}


def _start(tmp_path: Path, *extra: str) -> RespdServer:
    return start_server(tmp_path, "--data-dir", str(tmp_path / "data"), *extra, preset="small")


def _kill(server: RespdServer, sig: signal.Signals) -> None:
    server.process.send_signal(sig)
    server.process.wait(timeout=30)


def test_state_survives_sigterm_and_sigkill(tmp_path: Path) -> None:
    first = _start(tmp_path)
    client = first.client()
    a = create(client, "My name is Ada.")
    conv = client.conversations.create(metadata={"n": "1"})
    create(client, "Hello.", conversation=conv.id)
    _kill(first, signal.SIGTERM)
    first.assert_no_5xx()

    second = _start(tmp_path)
    client = second.client()
    assert strict(client.responses.retrieve(a.id)).model_dump() == a.model_dump()
    b = create(client, "What is my name?", previous_response_id=a.id)
    assert b.usage is not None and a.usage is not None
    assert b.usage.input_tokens > a.usage.input_tokens  # A's turn was replayed
    assert len(client.conversations.items.list(conv.id).data) == 2
    running = create(client, LONG_PROMPT, background=True, max_output_tokens=1500)
    deadline = time.monotonic() + 60
    while strict(client.responses.retrieve(running.id)).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    _kill(second, signal.SIGKILL)  # no chance to clean up

    third = _start(tmp_path)
    client = third.client()
    for stored in (a, b):
        assert strict(client.responses.retrieve(stored.id)).model_dump() == stored.model_dump()
    c = create(client, "And where?", previous_response_id=b.id)
    assert c.usage is not None and b.usage is not None
    assert c.usage.input_tokens > b.usage.input_tokens
    failed = strict(client.responses.retrieve(running.id))
    assert failed.status == "failed" and failed.error is not None
    assert "restarted" in failed.error.message
    # Its event log ends with the failure, so a stream replay terminates.
    events = list(client.responses.retrieve(running.id, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    _kill(third, signal.SIGTERM)
    third.assert_no_5xx()


def test_sigterm_during_background_job_stores_what_it_made(tmp_path: Path) -> None:
    """A background job the drain interrupts is stored terminal, incomplete with the
    output it had, never left in progress for the next start."""
    server = _start(tmp_path, "--shutdown-grace-secs", "1")
    client = server.client()
    # The grammar holds the answer to 400 numbers, so it cannot end within the grace by
    # itself (left free, the small model may stop counting early).
    job = strict(
        client.responses.create(
            model=MODEL_ID,
            input=LONG_PROMPT,
            background=True,
            max_output_tokens=1500,
            temperature=0,
            text={"format": COUNT},  # type: ignore[typeddict-item]
        )
    )
    deadline = time.monotonic() + 120
    # A live poll shows the output so far: wait for some (a loaded machine prefills slowly).
    while not client.responses.retrieve(job.id).output_text and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill(server, signal.SIGTERM)
    assert server.process.returncode == 0
    server.assert_no_5xx()
    again = _start(tmp_path)
    try:
        got = strict(again.client().responses.retrieve(job.id))
        assert got.status == "incomplete" and got.error is None
        assert got.output_text
        assert got.usage is not None and 0 < got.usage.output_tokens < 1500
    finally:
        again.stop()


def test_store_isolated_by_data_dir(tmp_path: Path) -> None:
    server = start_server(
        tmp_path, "--store", "sqlite:///custom.db", "--data-dir", str(tmp_path / "d")
    )
    try:
        created = create(server.client())
        assert (tmp_path / "d" / "custom.db").is_file()
        assert strict(server.client().responses.retrieve(created.id)).id == created.id
    finally:
        server.stop()
    (tmp_path / "elsewhere").mkdir()
    other = _start(tmp_path / "elsewhere")
    try:
        with pytest.raises(openai.NotFoundError):
            other.client().responses.retrieve(created.id)
    finally:
        other.stop()


def test_memory_store_flags_reach_the_server(tmp_path: Path) -> None:
    server = start_server(
        tmp_path,
        "--store",
        "memory",
        "--responses-store-max-entries",
        "1",
        "--conversation-store-max-entries",
        "0",
        "--threads",
        "2",
    )
    try:
        client = server.client()
        first = create(client)
        second = create(client)
        assert strict(client.responses.retrieve(second.id)).id == second.id
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(first.id)  # evicted: one entry kept
        conv = client.conversations.create()
        with pytest.raises(openai.NotFoundError):
            create(client, conversation=conv.id)  # conversations are disabled
    finally:
        server.stop()
    server.assert_no_5xx()


def test_job_killed_right_after_creation_replays_from_created(tmp_path: Path) -> None:
    """A background job killed at once, possibly before any of its event log reached the
    store, comes back failed, and its replay still opens with response.created."""
    first = _start(tmp_path, "--parallel", "1")
    client = first.client()
    busy = create(client, LONG_PROMPT, background=True, max_output_tokens=1500)
    waiting = create(client, "Say hi.", background=True)  # behind `busy` for the only slot
    _kill(first, signal.SIGKILL)

    second = _start(tmp_path)
    client = second.client()
    for job in (busy, waiting):
        failed = strict(client.responses.retrieve(job.id))
        assert failed.status == "failed" and failed.error is not None
        events = list(client.responses.retrieve(job.id, stream=True))
        assert events[0].type == "response.created" and events[-1].type == "response.failed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].response.id == job.id
    _kill(second, signal.SIGTERM)
    second.assert_no_5xx()
