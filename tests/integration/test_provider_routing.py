"""One public model id over three real upstreams on 127.0.0.1 — two respd processes and
llama.cpp's llama-server, all serving the embedded model — behind a front respd: the
request's `provider` object picks and orders them; killing the first moves requests to
the next with no 5xx and no duplicated text; a stream whose upstream dies after its first
delta ends `response.failed`; `allow_fallbacks: false` fails fast; the circuit opens after
its failures and closes after the cool-down once the provider is back. Through the real
`openai` SDK; responses checked with its types."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.llama_server import llama_server, llama_server_binary
from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, RespdServer, start_server, wait_until

PUBLIC = "hf/smollm2"
COOLDOWN = 3
FAILURES = 3
BACKEND = ("--ctx-size", "2048", "--store", "memory", "--parallel", "2")


@dataclass
class Fleet:
    front: RespdServer
    a: RespdServer
    b: RespdServer
    tmp: Path

    def restart_a(self) -> None:
        self.a = start_server(self.tmp, *BACKEND, port=self.a.port)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    llama_server_binary()  # skips (or fails under CI) before any server starts
    tmp = tmp_path_factory.mktemp("routing")
    a = start_server(tmp, *BACKEND)
    b = start_server(tmp, *BACKEND)
    with llama_server(tmp, "smol") as c_port:
        entries = [
            f"a=http://127.0.0.1:{a.port}/v1,model={MODEL_ID},model_id={PUBLIC},price_prompt=3",
            f"b=http://127.0.0.1:{b.port}/v1,model={MODEL_ID},model_id={PUBLIC},price_prompt=1",
            # llama-server cannot force a call for this template (see its own tests).
            f"c=http://127.0.0.1:{c_port}/v1,model=smol,model_id={PUBLIC},price_prompt=2,"
            "tool_choice=false",
        ]
        front = start_server(
            tmp,
            "--engine", "openai",
            *(arg for entry in entries for arg in ("--upstream", entry)),
            "--provider-breaker-failures", str(FAILURES),
            "--provider-breaker-cooldown-secs", str(COOLDOWN),
            "--ctx-size", "2048",
            "--store", "memory",
        )  # fmt: skip
        fleet = Fleet(front, a, b, tmp)
        try:
            yield fleet
        finally:
            front.stop()
            # Its 502s are the answers of requests that asked not to fall back.
            assert "Traceback" not in front.log(), front.log()[-4000:]
            fleet.a.stop()
            b.stop()


def _create(fleet: Fleet, **body: Any) -> httpx.Response:
    return httpx.post(
        fleet.front.base_url + "/v1/responses",
        json={"model": PUBLIC, "input": "Say hello.", "max_output_tokens": 12, **body},
        timeout=120,
    )


def _providers(fleet: Fleet) -> dict[str, dict[str, Any]]:
    table = httpx.get(fleet.front.base_url + "/v1/providers", timeout=10).json()["data"]
    return {row["provider"]: row for row in table}


def test_the_model_is_listed_once_with_its_providers(fleet: Fleet) -> None:
    models = fleet.front.client().models.list().data
    assert [m.id for m in models] == [PUBLIC]
    assert (models[0].model_extra or {})["providers"] == ["a", "b", "c"]


def test_order_only_ignore_and_sort_pick_the_provider(fleet: Fleet) -> None:
    client = fleet.front.client()
    for order in (["c", "a"], ["b"], ["a", "b"]):
        raw = client.responses.with_raw_response.create(
            model=PUBLIC,
            input="Say hello.",
            max_output_tokens=12,
            extra_body={"provider": {"order": order}},
        )
        body = json.loads(raw.text)
        strict_response(body)
        assert body["model"] == PUBLIC and body["output"]
        assert body["provider"]["name"] == order[0] and body["provider"]["failed"] == []
        assert raw.headers["x-respd-provider"] == order[0]
    assert _create(fleet, provider={"only": ["c"]}).json()["provider"]["name"] == "c"
    assert _create(fleet, provider={"ignore": ["a", "b"]}).json()["provider"]["name"] == "c"
    assert _create(fleet, provider={"sort": "price"}).json()["provider"]["name"] == "b"
    priced = _create(fleet, provider={"max_price": {"prompt": 2}, "order": ["c"]}).json()
    assert priced["provider"]["name"] == "c" and priced["provider"]["cost"] > 0
    # Chat Completions routes the same way; the bare name resolves to the vendor id.
    chat = httpx.post(
        fleet.front.base_url + "/v1/chat/completions",
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12,
            "provider": {"order": ["c"]},
        },
        timeout=60,
    )
    assert chat.status_code == 200 and chat.headers["x-respd-provider"] == "c"
    assert chat.json()["model"] == PUBLIC
    bad = _create(fleet, provider={"order": ["a"], "fallback": True})
    assert bad.status_code == 400 and "fallback" in json.dumps(bad.json()["error"])
    # Every provider measured: latency sorting has figures to go by.
    table = _providers(fleet)
    assert all(table[p]["latency_ms"] is not None for p in "abc")


def test_an_answer_cut_by_a_loop_names_its_provider(fleet: Fleet) -> None:
    """Greedy with its end of turn blocked, the embedded model loops; the front's repetition
    stop ends the turn on the chunk that closes the loop, before the provider's own end
    arrives. The upstream generation is cancelled, and the answer still names who gave it."""
    loop = {"ignore_eos": True, "temperature": 0, "dry_multiplier": 0}
    r = _create(fleet, max_output_tokens=900, provider={"order": ["b"]}, **loop)
    assert r.status_code == 200, r.text
    body = strict_response(r.json())
    assert body.status == "incomplete" and body.incomplete_details is not None
    assert body.incomplete_details.reason == "max_output_tokens"
    assert body.usage is not None and body.usage.output_tokens < 900
    assert r.headers["x-respd-provider"] == "b"
    assert r.json()["provider"]["name"] == "b"


def test_the_upstreams_file_is_read_again_on_sighup(fleet: Fleet) -> None:
    path = fleet.tmp / "upstreams.toml"
    entry = '[[upstream]]\nalias = "{0}"\nurl = "{1}/v1"\nmodel = "{2}"\nmodel_id = "{3}"\n'
    path.write_text(entry.format("b1", fleet.b.base_url, MODEL_ID, "team/smol"))
    front = start_server(
        fleet.tmp, "--engine", "openai", "--upstreams-file", str(path), "--store", "memory"
    )
    try:
        assert _models(front) == {"team/smol": ["b1"]}
        # A second provider for the model, and a new model, without a restart.
        path.write_text(
            entry.format("b1", fleet.b.base_url, MODEL_ID, "team/smol")
            + entry.format("b2", fleet.b.base_url, MODEL_ID, "team/smol")
            + entry.format("solo", fleet.b.base_url, MODEL_ID, "team/other")
        )
        front.process.send_signal(signal.SIGHUP)
        wait_until(lambda: _models(front) == {"team/smol": ["b1", "b2"], "team/other": ["solo"]})
        r = httpx.post(
            front.base_url + "/v1/responses",
            json={"model": "team/smol", "input": "hi", "max_output_tokens": 8,
                  "provider": {"order": ["b2"]}},
            timeout=60,
        )  # fmt: skip
        assert r.status_code == 200 and r.headers["x-respd-provider"] == "b2"
        # A file in error changes nothing.
        path.write_text("[[upstream]\n")
        front.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "upstreams not reloaded" in front.log())
        assert _models(front) == {"team/smol": ["b1", "b2"], "team/other": ["solo"]}
    finally:
        front.stop()
    assert "Traceback" not in front.log()


def _models(server: RespdServer) -> dict[str, list[str]]:
    data = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m.get("providers") for m in data}


def test_killing_a_provider_moves_requests_to_the_next(fleet: Fleet) -> None:
    client = fleet.front.client()
    # A stream whose upstream dies after its first delta ends failed: never restarted on
    # another provider, so no text is duplicated.
    stream = client.responses.create(
        model=PUBLIC,
        input="Write a long story about a lighthouse keeper and the sea.",
        max_output_tokens=600,
        stream=True,
        extra_body={"provider": {"order": ["a", "b"]}},
    )
    events = []
    for event in stream:
        events.append(strict_event(event.to_dict()))
        if event.type == "response.output_text.delta" and fleet.a.process.poll() is None:
            fleet.a.process.kill()
            fleet.a.process.wait()
    assert events[-1].type == "response.failed"
    assert events[-1].response.model_extra["provider"]["name"] == "a"  # type: ignore[union-attr,index]
    # Fail fast without fallbacks: the upstream's error, the next provider not asked.
    before = _providers(fleet)["b"]["requests"]
    fast = _create(fleet, provider={"order": ["a"], "allow_fallbacks": False})
    assert fast.status_code == 502, fast.text
    assert _providers(fleet)["b"]["requests"] == before
    # New requests go to the next provider: no 5xx, one answer, the failure named.
    answered = client.responses.with_raw_response.create(
        model=PUBLIC, input="Say hello.", max_output_tokens=12
    )
    body = strict_response(json.loads(answered.text))
    assert answered.headers["x-respd-provider"] == "b; failed=a"
    streamed = [
        strict_event(e.to_dict())
        for e in client.responses.create(
            model=PUBLIC, input="Count to five.", max_output_tokens=24, stream=True
        )
    ]
    final = streamed[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert text == final.response.output_text  # type: ignore[union-attr]
    assert body.output_text
    # The circuit opened after FAILURES failures in a row: a is skipped, not even tried.
    table = _providers(fleet)
    assert table["a"]["circuit"] == "open" and table["a"]["consecutive_failures"] == FAILURES
    skipped = _create(fleet)
    assert skipped.status_code == 200 and skipped.headers["x-respd-provider"] == "b"
    metrics = httpx.get(fleet.front.base_url + "/metrics", timeout=10).text
    assert f'respd_provider_fallbacks_total{{model="{PUBLIC}",provider="a"}}' in metrics
    # Back up, and after the cool-down one request probes it and closes the circuit.
    fleet.restart_a()
    time.sleep(COOLDOWN + 0.5)
    assert _providers(fleet)["a"]["circuit"] == "half_open"
    probe = _create(fleet)
    assert probe.status_code == 200 and probe.headers["x-respd-provider"] == "a"
    assert _providers(fleet)["a"]["circuit"] == "closed"


def test_cli_prints_the_routing_table(fleet: Fleet) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "respd", "providers", "--url", fleet.front.base_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for name in ("a", "b", "c"):
        assert f" {name} " in out or f"│ {name}" in out
    assert PUBLIC in out and "closed" in out
