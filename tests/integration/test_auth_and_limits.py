"""API keys, isolation, the request guard and per-key limits on a real `respd serve`, through
the `openai` SDK and raw HTTP: the keys file is re-read on SIGHUP, another key's objects are
404s, foreign hosts / origins / content types are refused, and the limits answer with their
documented status and headers."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.servers import MODEL_ID, RespdServer, start_server

KEY_A, KEY_B, KEY_C = "sk-alice-1", "sk-bob-2", "sk-carol-3"


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"{KEY_A} alice\n{KEY_B} bob\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys_file: Path) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("auth"),
        "--ctx-size", "1024",
        "--api-keys-file", str(keys_file),
        "--cors-origins", "https://app.example",
        "--max-request-bytes", "200000",
        "--max-streams-per-key", "1",
        "--rate-limit-rpm", "40",
    )  # fmt: skip
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def client(server: RespdServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def test_keys_identify_and_isolate(server: RespdServer) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        client(server, "sk-wrong").models.list()
    assert refused.value.code == "invalid_api_key"
    bare = httpx.get(server.base_url + "/v1/models")
    wrong = httpx.get(server.base_url + "/v1/models", headers={"authorization": "Bearer no"})
    assert bare.status_code == wrong.status_code == 401 and bare.json() == wrong.json()

    alice, bob = client(server, KEY_A), client(server, KEY_B)
    made = alice.responses.create(model=MODEL_ID, input="Say hi.", max_output_tokens=8)
    assert made.status in ("completed", "incomplete") and made.output_text
    assert alice.responses.retrieve(made.id).id == made.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model=MODEL_ID, input="more", previous_response_id=made.id)
    conv = alice.conversations.create(items=[{"role": "user", "content": "private"}])
    with pytest.raises(openai.NotFoundError):
        bob.conversations.items.list(conv.id)
    assert server.log().count(KEY_A) == 0  # the key never reaches the log


def test_sighup_rereads_the_keys_file(server: RespdServer, keys_file: Path) -> None:
    keys_file.write_text(f"{KEY_A} alice\n{KEY_C} carol\n")
    server.process.send_signal(signal.SIGHUP)
    carol = client(server, KEY_C)
    deadline = time.monotonic() + 10
    while True:
        try:
            carol.models.list()
            break
        except openai.AuthenticationError:
            assert time.monotonic() < deadline, "the new key never worked"
            time.sleep(0.1)
    with pytest.raises(openai.AuthenticationError):
        client(server, KEY_B).models.list()
    assert client(server, KEY_A).models.list().data


def test_guard_refuses_foreign_hosts_origins_and_content_types(server: RespdServer) -> None:
    url = server.base_url + "/v1/responses"
    body = {"model": MODEL_ID, "input": "hi", "max_output_tokens": 4}
    auth = {"authorization": f"Bearer {KEY_A}"}
    rebinding = httpx.post(url, json=body, headers=auth | {"host": "attacker.example:8080"})
    assert rebinding.status_code == 400 and rebinding.json()["error"]["code"] == "invalid_host"
    evil = httpx.post(url, json=body, headers=auth | {"origin": "https://evil.example"})
    assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    form = httpx.post(
        url, content=b'{"model":"x","input":"hi"}', headers={"content-type": "text/plain"}
    )
    assert form.status_code in (401, 415)  # without a key the 401 comes first
    form = httpx.post(
        url, content=b'{"model":"x","input":"hi"}', headers=auth | {"content-type": "text/plain"}
    )
    assert form.status_code == 415
    preflight = httpx.options(
        url,
        headers={
            "origin": "https://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    allowed = httpx.post(url, json=body, headers=auth | {"origin": "https://app.example"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"


def test_limits_answer_with_their_status_and_headers(server: RespdServer) -> None:
    url = server.base_url + "/v1/responses"
    auth = {"authorization": f"Bearer {KEY_A}"}
    big = httpx.post(url, json={"model": MODEL_ID, "input": "x" * 300_000}, headers=auth)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    ok = httpx.post(
        url, json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 4}, headers=auth
    )
    assert ok.headers["x-ratelimit-limit-requests"] == "40"
    assert int(ok.headers["x-ratelimit-remaining-requests"]) < 40

    # One stream per key: a second one is a 429 while the first is open.
    alice = client(server, KEY_A)
    with alice.responses.create(
        model=MODEL_ID, input="Count from 1 to 100.", stream=True, max_output_tokens=300
    ) as first:
        next(iter(first))
        with pytest.raises(openai.RateLimitError) as refused:
            alice.responses.create(model=MODEL_ID, input="hi", stream=True, max_output_tokens=4)
        assert refused.value.response.headers["retry-after"] == "1"
    # The slot comes back once the server has seen the client go.
    deadline = time.monotonic() + 10
    while True:
        try:
            again = alice.responses.create(
                model=MODEL_ID, input="hi", stream=True, max_output_tokens=4
            )
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the closed stream's slot never came back"
            time.sleep(0.5)  # each try counts against the key's requests per minute
    assert [e.type for e in again][-1] in ("response.completed", "response.incomplete")

    # Requests per minute: spend what is left of the window.
    codes = []
    for _ in range(45):
        r = httpx.post(
            server.base_url + "/v1/responses/input_tokens",
            json={"model": MODEL_ID, "input": "hi"},
            headers=auth,
        )
        assert r.status_code == 200  # counting tokens does not generate: never limited
        g = httpx.post(
            url, json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 1}, headers=auth
        )
        codes.append(g.status_code)
        if g.status_code == 429:
            assert g.json()["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(g.headers["retry-after"]) <= 60
            assert g.headers["x-ratelimit-remaining-requests"] == "0"
            break
    assert codes[-1] == 429 and set(codes[:-1]) == {200}


def test_an_open_server_beyond_loopback_warns(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--host", "0.0.0.0", "--ctx-size", "512", "--store", "memory")
    try:
        assert httpx.get(srv.base_url + "/v1/models").status_code == 200  # open, as warned
    finally:
        srv.stop()
    assert "no API keys are configured" in srv.log()
