"""Log lines carry the request id and the caller's key label, as text or JSON; prompts are
logged only when asked."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest
import uvicorn.logging

from respd.engines.fake import FakeEngine, Reply
from respd.logs import (
    TEXT_FORMAT,
    ContextFilter,
    JsonFormatter,
    LogSettings,
    configure_logging,
    current_request_id,
    request_context,
    set_log_identity,
    set_prompts_logged,
    uvicorn_log_config,
)
from tests.support.fake import FAKE_MODEL


class Lines(logging.Handler):
    """Keeps the formatted lines."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.addFilter(ContextFilter())
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture()
def json_lines(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    caplog.set_level(logging.DEBUG)  # lets every record reach the root handlers
    handler = Lines(JsonFormatter())
    logging.getLogger().addHandler(handler)
    yield handler.lines
    logging.getLogger().removeHandler(handler)


@pytest.fixture()
def prompts_on() -> Iterator[None]:
    set_prompts_logged(True)
    yield
    set_prompts_logged(False)


async def test_json_lines_carry_the_request_id(
    engine: FakeEngine, http: httpx.AsyncClient, json_lines: list[str]
) -> None:
    engine.add(Reply(["Hel", RuntimeError("the GPU caught fire")]))
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi"})
    assert r.status_code == 200
    records = [json.loads(line) for line in json_lines]
    failed = [rec for rec in records if rec["message"] == "generation raised"]
    assert len(failed) == 1
    line = failed[0]
    assert line["request_id"] == r.headers["x-request-id"]
    assert line["key"] == "-"
    assert line["level"] == "ERROR"
    assert line["logger"] == "respd.service.generation.core"
    assert "RuntimeError: the GPU caught fire" in line["exc_info"]
    assert {"ts", "level", "logger", "message", "request_id", "key"} <= set(line)
    assert current_request_id() == "-"  # restored after the request


async def test_a_client_request_id_is_the_logged_one(
    engine: FakeEngine, http: httpx.AsyncClient, json_lines: list[str]
) -> None:
    engine.add(Reply(["x"], finish="error", error="decode failed"))
    r = await http.post(
        "/v1/responses",
        json={"model": FAKE_MODEL, "input": "hi"},
        headers={"x-request-id": "req_from_client"},
    )
    assert r.headers["x-request-id"] == "req_from_client"
    ids = {json.loads(line)["request_id"] for line in json_lines}
    assert "req_from_client" in ids


def test_identity_and_request_id_in_text_lines() -> None:
    handler = Lines(logging.Formatter(TEXT_FORMAT))
    log = logging.getLogger("respd.test_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with request_context("req_abc"):
            set_log_identity("team-a")
            log.info("inside")
        log.info("outside")
    finally:
        log.removeHandler(handler)
    assert "[req_abc team-a]: inside" in handler.lines[0]
    assert "[- -]: outside" in handler.lines[1]


async def test_prompts_are_not_logged_by_default(
    engine: FakeEngine, http: httpx.AsyncClient, json_lines: list[str]
) -> None:
    engine.add("ok")
    body = {"model": FAKE_MODEL, "input": "my secret words"}
    assert (await http.post("/v1/responses", json=body)).status_code == 200
    assert not any("secret words" in line for line in json_lines)


async def test_prompts_logged_when_enabled(
    engine: FakeEngine, http: httpx.AsyncClient, json_lines: list[str], prompts_on: None
) -> None:
    engine.add("ok")
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "my secret words"}]}
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    logged = [json.loads(line) for line in json_lines if "secret words" in line]
    assert len(logged) == 1
    assert logged[0]["request_id"] == r.headers["x-request-id"]
    assert logged[0]["message"].startswith("prompt (")


def test_configure_logging_json(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging(LogSettings(level="debug", format="json"))
        with request_context("req_cfg"):
            logging.getLogger("respd.x").debug("hello %s", "there")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "hello there"
    assert line["request_id"] == "req_cfg"
    assert line["level"] == "DEBUG"


def test_uvicorn_access_lines() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "POST", "/v1/responses", "1.1", 500),
        None,
    )
    with request_context("req_acc"):
        ContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "req_acc"
    assert line["status"] == 500 and line["path"] == "/v1/responses"

    config = uvicorn_log_config(LogSettings())
    fmt = config["formatters"]["access"]["fmt"]
    text = uvicorn.logging.AccessFormatter(fmt, use_colors=False).format(record)
    # The status keeps uvicorn's phrase: log checks look for `" 500 `.
    assert '[req_acc -] 127.0.0.1:5000 - "POST /v1/responses HTTP/1.1" 500 Internal' in text
    assert config["handlers"]["access"]["filters"] == ["context"]
