"""Several local GGUF models behind one real server: a models directory the test writes
(copies of the embedded model under four names, and a corrupt file) and a presets file.
Requests alternate between models, each loaded on first use; `--models-max` unloads the
least recently used; the pinned model stays; a ttl unloads an idle one; the corrupt file
fails alone with a 503 naming it; eight concurrent first requests cause one load; the
operators' routes and `respd models` load and unload. Through the real `openai` SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from respd.config import embedded_model_path
from tests.support.sdk_types import strict_response
from tests.support.servers import RespdServer, start_server, wait_until

TTL = 2


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("models")
    folder = tmp / "models"
    folder.mkdir()
    for name in ("alpha", "bravo", "charlie", "delta"):
        os.link(embedded_model_path(), folder / f"{name}.Q8_0.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(4096))
    presets = tmp / "models.toml"
    presets.write_text(
        '[[model]]\nalias = "charlie"\npin = true\n\n'
        f'[[model]]\nalias = "delta"\nttl = {TTL}\nctx_size = 1024\ntemperature = 0.0\n'
    )
    server = start_server(
        tmp,
        "--models-dir", str(folder),
        "--models-file", str(presets),
        "--models-max", "3",
        "--ctx-size", "1024",
        "--store", "memory",
    )  # fmt: skip
    yield server
    server.stop()


def _loaded(server: RespdServer) -> dict[str, bool]:
    cards = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return {c["id"]: c["loaded"] for c in cards}


def _card(server: RespdServer, model: str) -> dict[str, Any]:
    card: dict[str, Any] = httpx.get(server.base_url + f"/v1/models/{model}", timeout=10).json()
    return card


def _ask(client: openai.OpenAI, model: str) -> str:
    raw = client.responses.with_raw_response.create(
        model=model, input="Say hi.", max_output_tokens=8
    )
    body = strict_response(json.loads(raw.text))
    assert body.model == model
    return body.output_text


def test_models_load_on_first_use_and_the_least_recently_used_goes(pool: RespdServer) -> None:
    client = pool.client()
    # The pinned model was loaded at start; the others wait for their first request.
    assert _loaded(pool) == {
        "alpha": False,
        "bravo": False,
        "charlie": True,
        "delta": False,
        "broken": False,
    }
    for model in ("alpha", "bravo", "alpha", "bravo", "alpha"):
        assert _ask(client, model)
    assert _loaded(pool)["alpha"] and _loaded(pool)["bravo"]
    assert _card(pool, "alpha")["loads"] == 1
    # A fourth model, with three the most: bravo was used least recently; charlie is pinned.
    assert _ask(client, "delta")
    assert _loaded(pool) == {
        "alpha": True,
        "bravo": False,
        "charlie": True,
        "delta": True,
        "broken": False,
    }
    assert _card(pool, "delta")["context_window"] == 1024
    # delta's ttl unloads it once idle; the others have none.
    wait_until(lambda: not _loaded(pool)["delta"], timeout=TTL + 10)
    assert _loaded(pool)["alpha"] and _loaded(pool)["charlie"]


def test_a_corrupt_model_fails_alone(pool: RespdServer) -> None:
    r = httpx.post(
        pool.base_url + "/v1/responses", json={"model": "broken", "input": "hi"}, timeout=60
    )
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["code"] == "model_load_failed" and "broken" in error["message"]
    assert _card(pool, "broken")["load_error"]
    assert _ask(pool.client(), "alpha")
    assert httpx.get(pool.base_url + "/health", timeout=10).status_code == 200


def test_concurrent_first_requests_cause_one_load(pool: RespdServer) -> None:
    unload = httpx.post(pool.base_url + "/v1/models/bravo/unload", timeout=30)
    assert unload.status_code == 200
    assert not _loaded(pool)["bravo"]
    before = _card(pool, "bravo")["loads"]
    client = pool.client()
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda _: _ask(client, "bravo"), range(8)))
    assert all(answers)
    assert _card(pool, "bravo")["loads"] == before + 1


def test_the_models_command_lists_loads_and_unloads(pool: RespdServer) -> None:
    def respd(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "respd", "models", *args, "--url", pool.base_url],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    respd("unload", "alpha")
    assert not _loaded(pool)["alpha"]
    loaded = json.loads(respd("load", "alpha"))
    assert loaded["id"] == "alpha" and loaded["loaded"] is True
    listing = respd("list")
    for name in ("alpha", "bravo", "charlie", "delta", "broken"):
        assert name in listing
    busy = subprocess.run(
        [sys.executable, "-m", "respd", "models", "unload", "--url", pool.base_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert busy.returncode == 2 and "name the model" in busy.stderr


def test_a_models_file_in_error_stops_start_up(tmp_path: Path) -> None:
    presets = tmp_path / "models.toml"
    presets.write_text('[[model]]\nalias = "x"\ncolour = "red"\n')
    done = subprocess.run(
        [sys.executable, "-m", "respd", "serve", "--models-file", str(presets)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "colour" in done.stderr


async def test_an_unloaded_engine_refuses_late_requests() -> None:
    """A request that looked its model up just before the model was unloaded is refused
    (a 503 to retry, upstream), never run on the freed model."""
    from respd.engines.base import EngineBusy, PromptRequest, SamplingParams
    from respd.engines.llamacpp import LlamaCppEngine
    from respd.engines.messages import ChatMessage

    engine = LlamaCppEngine(embedded_model_path(), model_id="late", n_ctx=512, n_threads=2)
    request = PromptRequest([ChatMessage("user", "hi")])
    prompt = await engine.prepare(request)
    engine.close()
    with pytest.raises(EngineBusy, match="unloaded"):
        await engine.prepare(request)
    with pytest.raises(EngineBusy, match="unloaded"):
        engine.generate(prompt, SamplingParams(max_tokens=2))
