"""Background responses: queued at once, polled, cancelled mid-generation, streamed live and
replayed (`responses.stream(response_id=..., starting_after=N)`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import pytest

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

TERMINAL = {"completed", "incomplete", "failed", "cancelled"}


def test_background_poll_to_completion(sclient: openai.OpenAI) -> None:
    queued = create(sclient, background=True, max_output_tokens=8)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = poll(sclient, queued.id, lambda r: r.status in TERMINAL)
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage is not None and done.usage.output_tokens > 0
    # Cancelling a finished response returns it unchanged.
    assert strict(sclient.responses.cancel(done.id)).model_dump() == done.model_dump()


def test_background_cancel_stops_generation(
    sclient: openai.OpenAI, stateful_server: RespdServer
) -> None:
    before = engine_stats(stateful_server.base_url)
    queued = create(sclient, LONG_PROMPT, background=True, max_output_tokens=1500)
    running = poll(sclient, queued.id, lambda r: len(r.output_text) > 10)
    assert running.status == "in_progress"
    cancelled = strict(sclient.responses.cancel(queued.id))
    assert cancelled.status == "cancelled"
    assert cancelled.output_text.startswith(running.output_text)
    assert cancelled.usage is not None and 0 < cancelled.usage.output_tokens < 1500
    # The generation really stopped: the engine counted a cancellation, runs nothing, and
    # produces no more tokens; the stored response never changes again.
    stats = engine_stats(stateful_server.base_url)
    deadline = time.monotonic() + 30
    while stats["running"] or stats["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
        stats = engine_stats(stateful_server.base_url)
    time.sleep(0.5)
    assert engine_stats(stateful_server.base_url)["generated_tokens"] == stats["generated_tokens"]
    later = strict(sclient.responses.retrieve(queued.id))
    assert later.model_dump() == cancelled.model_dump()
    assert strict(sclient.responses.cancel(queued.id)).status == "cancelled"


def test_background_stream_resumes_with_starting_after(sclient: openai.OpenAI) -> None:
    # The client goes away after a few events; the job carries on.
    seen = leave_background_stream(sclient, 6, max_output_tokens=40)
    first = seen[0]
    assert first.type == "response.created" and first.response.status == "queued"
    assert [e.type for e in seen[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    last_seen = seen[-1].sequence_number
    with sclient.responses.stream(
        response_id=first.response.id, starting_after=last_seen
    ) as resumed:
        rest = [strict_event(e) for e in resumed]
        final = resumed.get_final_response() if rest[-1].type == "response.completed" else None
    numbers = [e.sequence_number for e in rest]
    assert numbers == list(range(last_seen + 1, last_seen + 1 + len(rest)))
    assert rest[-1].type in ("response.completed", "response.incomplete")
    stored = strict(sclient.responses.retrieve(first.response.id))
    assert strict(rest[-1].response).model_dump() == stored.model_dump()
    if final is not None:
        assert final.id == stored.id
    # A full replay after the end starts at response.created and matches the live prefix.
    replay = [strict_event(e) for e in sclient.responses.retrieve(first.response.id, stream=True)]
    assert [e.sequence_number for e in replay] == list(range(len(replay)))
    assert [e.to_dict() for e in replay[: len(seen)]] == [e.to_dict() for e in seen]
    assert [_plain(e) for e in replay[len(seen) :]] == [_plain(e) for e in rest]


def _plain(event: Any) -> dict[str, Any]:
    """An event as the server sent it (without the SDK helper's enrichments)."""
    data: dict[str, Any] = event.to_dict()
    for enrichment in ("snapshot", "parsed"):
        data.pop(enrichment, None)
    return data


def test_stream_replay_needs_a_background_response(sclient: openai.OpenAI) -> None:
    plain = create(sclient)
    with pytest.raises(openai.BadRequestError):
        list(sclient.responses.retrieve(plain.id, stream=True))
    with pytest.raises(openai.NotFoundError):
        list(sclient.responses.retrieve("resp_nope", stream=True))


def test_deleting_a_running_job_stops_it(
    sclient: openai.OpenAI, stateful_server: RespdServer
) -> None:
    queued = create(sclient, LONG_PROMPT, background=True, max_output_tokens=1500)
    poll(sclient, queued.id, lambda r: len(r.output_text) > 0)
    sclient.responses.delete(queued.id)
    with pytest.raises(openai.NotFoundError):
        sclient.responses.retrieve(queued.id)
    deadline = time.monotonic() + 30
    while engine_stats(stateful_server.base_url)["running"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # nothing writes it back once the job has wound down
    with pytest.raises(openai.NotFoundError):
        sclient.responses.retrieve(queued.id)


def test_background_turn_joins_its_conversation(sclient: openai.OpenAI) -> None:
    conv = sclient.conversations.create()
    queued = create(sclient, "Hello.", background=True, conversation=conv.id)
    done = poll(sclient, queued.id, lambda r: r.status in TERMINAL)
    items = sclient.conversations.items.list(conv.id, order="asc").data
    assert [i.id for i in items][-1] == done.output[0].id
    assert len(items) == 2


def test_a_job_waiting_for_a_slot_reads_queued_then_in_progress(tmp_path: Path) -> None:
    """With the one slot busy, a background job stays `queued` (and can be cancelled so);
    once the slot frees it turns `in_progress`, then completes."""
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "2048", "--store", "memory")
    try:
        client = server.client()
        busy = create(client, LONG_PROMPT, background=True, max_output_tokens=1500)
        poll(client, busy.id, lambda r: r.status == "in_progress")
        waiting = create(client, LONG_PROMPT, background=True, max_output_tokens=60)
        dropped = create(client, "Say hi.", background=True, max_output_tokens=8)
        for _ in range(5):
            assert strict(client.responses.retrieve(waiting.id)).status == "queued"
            time.sleep(0.1)
        cancelled = strict(client.responses.cancel(dropped.id))
        assert cancelled.status == "cancelled" and cancelled.output == []
        statuses = ["queued"]  # as read above, while the slot was busy
        client.responses.cancel(busy.id)
        deadline = time.monotonic() + 60
        while statuses[-1] not in TERMINAL:
            assert time.monotonic() < deadline, statuses
            status = strict(client.responses.retrieve(waiting.id)).status
            if statuses[-1] != status:
                statuses.append(status)
            time.sleep(0.01)
        assert statuses == ["queued", "in_progress", statuses[-1]], statuses
        assert statuses[-1] in ("completed", "incomplete")
        assert strict(client.responses.retrieve(dropped.id)).status == "cancelled"
    finally:
        server.stop()
    server.assert_no_5xx()
