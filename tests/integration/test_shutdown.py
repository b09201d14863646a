"""SIGTERM while generations run: running streams get their terminal event, a waiting
non-streaming request gets its JSON, new requests are refused, and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, start_server

STORY = "Write a very long story about a lighthouse keeper and the sea."


def _stream(base: str, out: dict[str, Any], started: threading.Event) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120)
    events = []
    with client.responses.create(
        model=MODEL_ID, input=STORY, max_output_tokens=3000, temperature=0, stream=True
    ) as stream:
        for event in stream:
            events.append(strict_event(event.to_dict()))
            if event.type == "response.output_text.delta":
                started.set()
    out["events"] = events


def _blocking(base: str, out: dict[str, Any]) -> None:
    r = httpx.post(
        base + "/v1/responses",
        json={"model": MODEL_ID, "input": STORY, "max_output_tokens": 3000, "temperature": 0},
        timeout=120,
    )
    out["status"] = r.status_code
    out["body"] = r.json()


def test_sigterm_ends_every_generation_honestly_and_exits_0(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--threads", "1", "--parallel", "3", "--shutdown-grace-secs", "1")
    streams = [dict[str, Any]() for _ in range(2)]
    blocking: dict[str, Any] = {}
    started = [threading.Event() for _ in streams]
    threads = [
        threading.Thread(target=_stream, args=(srv.base_url, out, ev))
        for out, ev in zip(streams, started, strict=True)
    ]
    threads.append(threading.Thread(target=_blocking, args=(srv.base_url, blocking)))
    for t in threads:
        t.start()
    try:
        for ev in started:
            assert ev.wait(60), "a stream never started"
        time.sleep(0.5)  # the non-streaming request is generating too
        t0 = time.monotonic()
        srv.process.send_signal(signal.SIGTERM)
        code = srv.process.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        for t in threads:
            t.join(timeout=60)
        srv.stop()
    assert code == 0, srv.log()[-3000:]
    assert took < 30
    for out in streams:
        types = [e.type for e in out["events"]]
        assert types[-1] == "response.incomplete", types[-5:]
        assert out["events"][-1].response.status == "incomplete"  # type: ignore[union-attr]
    assert blocking["status"] == 200
    resp = strict_response(blocking["body"])
    assert resp.status == "incomplete" and resp.output_text
    assert "interrupted 3 generation(s)" in srv.log()
    assert "Traceback" not in srv.log()


def test_requests_during_the_drain_are_refused(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--threads", "1", "--shutdown-grace-secs", "5")
    out: dict[str, Any] = {}
    started = threading.Event()
    worker = threading.Thread(target=_stream, args=(srv.base_url, out, started))
    worker.start()
    try:
        assert started.wait(60)
        srv.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        try:
            r = httpx.post(
                srv.base_url + "/v1/responses", json={"model": MODEL_ID, "input": "hi"}, timeout=30
            )
        except httpx.HTTPError:
            pass  # the listener is closed: not accepted at all
        else:
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "server_shutting_down"
        assert srv.process.wait(timeout=60) == 0
    finally:
        worker.join(timeout=60)
        srv.stop()
    assert out["events"][-1].type == "response.incomplete"
