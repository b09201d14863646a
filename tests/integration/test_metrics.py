"""Operations telemetry on the real server: `/metrics` after a real generation, and
`--log-format json` log lines carrying the request id."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import MODEL_ID, start_server


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_after_a_real_generation(client: openai.OpenAI, http: httpx.Client) -> None:
    resp = client.responses.create(model=MODEL_ID, input="Say hi.", max_output_tokens=8)
    assert resp.usage is not None and resp.usage.output_tokens > 0
    r = http.get("/metrics")
    assert r.status_code == 200
    samples = _samples(r.text)
    model = frozenset({("model", MODEL_ID)})
    assert samples[("respd_output_tokens_total", frozenset({("api", "responses")}))] > 0
    assert samples[("respd_slots_total", model)] >= 1
    assert ("respd_slots_active", model) in samples
    assert ("respd_queue_depth", model) in samples
    route = frozenset({("route", "/v1/responses"), ("method", "POST"), ("status", "200")})
    assert samples[("respd_requests_total", route)] >= 1
    ttft = frozenset({("api", "responses")})
    assert samples[("respd_time_to_first_token_seconds_count", ttft)] >= 1


def test_json_logs_carry_the_request_id(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--log-format", "json", preset="compact")
    try:
        r = httpx.post(
            server.base_url + "/v1/responses",
            json={"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200
        request_id = r.headers["x-request-id"]
    finally:
        server.stop()
    lines = [line for line in server.log().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records, server.log()[-2000:]
    for record in records:
        assert {"ts", "level", "logger", "message", "request_id", "key"} <= set(record)
    access = [
        rec
        for rec in records
        if rec["logger"] == "uvicorn.access" and rec.get("path") == "/v1/responses"
    ]
    assert len(access) == 1, records
    assert access[0]["request_id"] == request_id
    assert access[0]["status"] == 200
    # uvicorn's own lines (startup, shutdown) are JSON too.
    log_lines = server.log().splitlines()
    assert not any(line.startswith(("INFO:", "WARNING:", "ERROR:")) for line in log_lines)
