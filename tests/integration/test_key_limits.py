"""Per-key limits over every transport on a real `respd serve`, through the `openai` SDK:
background jobs and WebSocket responses share the stream budget, WebSocket creates count
against the rate, the background, storage and WebSocket caps answer with their documented
errors, and one key flooding the engine with background jobs leaves another served."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server
from tests.support.websocket import turn

KEY_A, KEY_B = "sk-alice-1", "sk-bob-2"
LONG = "Write a long story about a lighthouse keeper."


def _keys(tmp: Path) -> str:
    path = tmp / "keys.txt"
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\n")
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("respd-key-limits")
    srv = start_server(
        tmp,
        "--ctx-size", "1024",
        "--api-keys-file", _keys(tmp),
        "--max-streams-per-key", "2",
        "--max-background-per-key", "2",
        "--max-storage-bytes-per-key", "200000",  # above what the other tests store
        "--max-websockets-per-key", "2",
        "--max-websockets", "3",
        "--rate-limit-rpm", "60",
        # A store of its own: a server sharing the session's sqlite file would recover, and
        # so take over, the background jobs this one runs.
        "--data-dir", str(tmp / "data"),
    )  # fmt: skip
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def client(server: RespdServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _turn(conn: Any, **body: Any) -> list[Any]:
    return turn(conn, MODEL_ID, **body)


def _finished(sdk: openai.OpenAI, rid: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = sdk.responses.retrieve(rid).status
        if status in ("completed", "incomplete", "failed", "cancelled"):
            return str(status)
        time.sleep(0.2)
    raise AssertionError(f"{rid} did not finish")


def test_background_and_websocket_share_the_budget(server: RespdServer) -> None:
    alice, bob = client(server, KEY_A), client(server, KEY_B)
    jobs = [
        alice.responses.create(model=MODEL_ID, input=LONG, background=True, max_output_tokens=64)
        for _ in range(2)
    ]
    with pytest.raises(openai.RateLimitError) as third:
        alice.responses.create(model=MODEL_ID, input=LONG, background=True, max_output_tokens=8)
    assert third.value.code == "too_many_background_responses"
    with pytest.raises(openai.RateLimitError) as streamed:
        alice.responses.create(model=MODEL_ID, input="Hi", stream=True, max_output_tokens=4)
    assert streamed.value.code == "rate_limit_exceeded"  # both slots are the jobs'
    with alice.responses.connect() as conn:
        (error,) = _turn(conn, input="Hi", max_output_tokens=4)
        assert error.type == "error" and error.status == 429
        other = bob.responses.create(model=MODEL_ID, input="Hi", stream=True, max_output_tokens=4)
        assert [e.type for e in other][-1] in ("response.completed", "response.incomplete")
        for job in jobs:
            assert _finished(alice, job.id) in ("completed", "incomplete")
        events = _turn(conn, input="Say hi.", max_output_tokens=4)  # the slots are back
        assert events[-1].type in ("response.completed", "response.incomplete")


def test_websocket_connection_caps(server: RespdServer) -> None:
    alice, bob = client(server, KEY_A), client(server, KEY_B)
    with alice.responses.connect() as one, alice.responses.connect() as two:
        with pytest.raises(Exception) as per_key, alice.responses.connect() as extra:
            extra.recv()
        assert "403" in str(per_key.value)
        with bob.responses.connect() as three:
            with pytest.raises(Exception) as total, bob.responses.connect() as extra:
                extra.recv()
            assert "403" in str(total.value)
            for conn in (one, two, three):
                assert _turn(conn, input="Hi", max_output_tokens=4)[-1].type != "error"
    with bob.responses.connect() as again:  # closed sockets free their places
        assert _turn(again, input="Hi", max_output_tokens=4)[-1].type != "error"


def test_storage_quota(server: RespdServer) -> None:
    bob = client(server, KEY_B)
    kept = bob.files.create(file=("a.txt", b"x" * 150000), purpose="user_data")
    with pytest.raises(openai.APIStatusError) as refused:
        bob.files.create(file=("b.txt", b"y" * 60000), purpose="user_data")
    assert refused.value.status_code == 413
    assert refused.value.code == "storage_quota_exceeded"
    assert [f.id for f in bob.files.list()] == [kept.id]  # nothing stored by the refusal
    alice = client(server, KEY_A)
    assert alice.files.create(file=("a.txt", b"x" * 60000), purpose="user_data").id
    bob.files.delete(kept.id)
    assert bob.files.create(file=("b.txt", b"y" * 60000), purpose="user_data").id


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("respd-fair-queue")
    srv = start_server(
        tmp,
        "--ctx-size", "1024",
        "--api-keys-file", _keys(tmp),
        "--parallel", "1",
        "--max-queue", "6",
        "--store", "memory",  # the other module server holds the session's sqlite file
    )  # fmt: skip
    yield srv
    srv.stop()
    srv.assert_no_5xx(allow_503=True)  # alice's flood beyond her share


def test_a_background_flood_leaves_another_key_served(narrow: RespdServer) -> None:
    alice, bob = client(narrow, KEY_A), client(narrow, KEY_B)
    accepted, busy = [], 0
    for _ in range(40):
        try:
            accepted.append(
                alice.responses.create(
                    model=MODEL_ID, input=LONG, background=True, max_output_tokens=24
                )
            )
        except openai.InternalServerError as exc:
            assert exc.status_code == 503
            busy += 1
    assert len(accepted) == 7 and busy == 33  # 1 slot + 6 queued, then her share is spent
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda _: bob.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=8),
                range(2),
            )
        )
    for answer in answers:
        assert strict_response(answer.model_dump()).status in ("completed", "incomplete")
    # Bob was served in turn, not behind alice's whole queue: some of hers still wait.
    waiting = [r.id for r in accepted if alice.responses.retrieve(r.id).status == "queued"]
    assert waiting, "bob was only served after alice's whole queue"
    for job in accepted:
        assert _finished(alice, job.id, timeout=300) in ("completed", "incomplete")
