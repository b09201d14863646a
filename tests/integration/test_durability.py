"""Durability and retention through a real server: every response a client got a 200 for
survives a SIGKILL in the middle of a burst of writes, and expired records disappear from
the API at once and from the database by the background purge. For sqlite and postgresql."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from tests.support.pg import fresh_schema
from tests.support.servers import MODEL_ID, RespdServer, start_server
from tests.support.stateful import create, strict


@pytest.fixture(params=["sqlite", "postgresql"])
def store_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """`--store`/`--data-dir` for a new, empty store of the kind."""
    args = ["--data-dir", str(tmp_path / "data")]
    with ExitStack() as exits:
        if request.param == "postgresql":
            args += ["--store", exits.enter_context(fresh_schema())]
        yield args


def test_acknowledged_responses_survive_sigkill_mid_burst(
    store_args: list[str], tmp_path: Path
) -> None:
    common = [*store_args, "--threads", "1", "--parallel", "4", "--ctx-size", "512"]
    first = start_server(tmp_path, *common)
    acked: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    lock = threading.Lock()
    killed = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=first.base_url, timeout=60) as http:
            for n in range(1000):
                body = {
                    "model": MODEL_ID,
                    "input": f"Say the number {worker * 1000 + n}.",
                    "max_output_tokens": 3,
                    "temperature": 0,
                    "store": True,
                }
                try:
                    answer = http.post("/v1/responses", json=body)
                except httpx.HTTPError:
                    return  # the server is gone: this request was never acknowledged
                if answer.status_code != 200:
                    with lock:
                        failures.append(answer.text)
                    return
                with lock:
                    acked[answer.json()["id"]] = answer.json()
                if killed.is_set():
                    return

    threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while len(acked) < 16:  # well into the burst, with requests in flight on every slot
        assert time.monotonic() < deadline and not failures, failures
        time.sleep(0.02)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)
    killed.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    first.assert_no_5xx()

    second = start_server(tmp_path, *common)  # the store opens cleanly after the kill
    try:
        client_ = second.client()
        for rid, body in acked.items():
            got = strict(client_.responses.retrieve(rid))
            assert got.model_dump() == strict(body).model_dump()
            assert got.status in ("completed", "incomplete") and got.store is True
        # The store still takes writes, and chains onto what survived.
        last = strict(next(reversed(acked.values())))
        chained = create(client_, "And again.", previous_response_id=last.id)
        assert chained.usage is not None and last.usage is not None
        assert chained.usage.input_tokens > last.usage.input_tokens
    finally:
        second.stop()
    second.assert_no_5xx()


def _rows(server: RespdServer, store_args: list[str]) -> int:
    """Responses and conversations rows in the server's database, read directly."""
    query = "SELECT (SELECT COUNT(*) FROM responses) + (SELECT COUNT(*) FROM conversations)"
    if "--store" in store_args:
        with psycopg.connect(store_args[store_args.index("--store") + 1]) as conn:
            row = conn.execute(query).fetchone()
    else:
        path = Path(store_args[store_args.index("--data-dir") + 1]) / "respd.sqlite3"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_expired_records_vanish_then_get_purged(store_args: list[str], tmp_path: Path) -> None:
    ttl = 3
    server = start_server(
        tmp_path,
        *store_args,
        "--threads",
        "1",
        "--responses-store-ttl-secs",
        str(ttl),
        "--conversation-store-ttl-secs",
        str(ttl),
        "--store-purge-interval-secs",
        "0.5",
    )
    try:
        client = server.client()
        created = create(client)
        conv = client.conversations.create(items=[{"role": "user", "content": "hi"}])
        written = time.monotonic()
        assert strict(client.responses.retrieve(created.id)).id == created.id
        assert client.conversations.retrieve(conv.id).id == conv.id
        assert _rows(server, store_args) == 2
        time.sleep(max(0.0, written + ttl + 1.5 - time.monotonic()))
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(conv.id)
        with pytest.raises(openai.NotFoundError) as err:
            create(client, "next", previous_response_id=created.id)
        assert err.value.code == "previous_response_not_found"
        # The periodic purge (every 0.5 s) has taken the rows away too.
        deadline = time.monotonic() + 10
        while _rows(server, store_args):
            assert time.monotonic() < deadline, "expired rows were never purged"
            time.sleep(0.2)
    finally:
        server.stop()
    server.assert_no_5xx()
