"""`respd pull` against an imitation of the Hugging Face hub on 127.0.0.1 (`HF_ENDPOINT`):
download with progress, the projector alongside, a cache hit, a resumed download, a refused
checksum, offline mode, the token, and a server started on the pulled file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from respd.config.engine import embedded_model_path
from tests.support.gguf.llava import write_projector
from tests.support.hub_server import (
    N_EMBD,
    HubFile,
    HubImitation,
    serving_hub,
    write_tiny_chat_model,
)
from tests.support.servers import start_server

MODEL = "Tiny-Q4_K_M.gguf"
OTHER = "Tiny-Q8_0.gguf"
PROJECTOR = "mmproj-Tiny-F16.gguf"
BIG = "Big-Q8_0.gguf"
# Over huggingface_hub's 10 MB write chunk, so that a transfer cut past it leaves bytes on disk.
BIG_SIZE = 24 * 1024 * 1024


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubImitation]:
    made = tmp_path_factory.mktemp("hub-files")
    tokenizer = embedded_model_path()
    tiny = {
        MODEL: write_tiny_chat_model(made / "a.gguf", tokenizer, seed=1),
        OTHER: write_tiny_chat_model(made / "b.gguf", tokenizer, seed=2),
        PROJECTOR: write_projector(made / "p.gguf", proj_dim=N_EMBD),
    }
    big = np.random.default_rng(7).integers(0, 256, BIG_SIZE, dtype=np.uint8).tobytes()
    repos = {
        "owner/tiny": {
            **{name: HubFile(path.read_bytes()) for name, path in tiny.items()},
            "README.md": HubFile(b"# tiny\n", lfs=False),
        },
        "owner/big": {BIG: HubFile(big)},
    }
    with serving_hub(HubImitation(repos=repos)) as running:
        yield running


def pull(
    hub: HubImitation, cache: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`respd pull` as a user runs it, with the hub's address in `HF_ENDPOINT` (which
    huggingface_hub reads at import: a subprocess gets it from the start)."""
    inherited = {
        k: v for k, v in os.environ.items() if k not in {"HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"}
    }
    full_env = {
        **inherited,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(cache / "hf-home"),  # no token file of the machine's user
        "RESPD_HUB_CACHE": str(cache),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "respd", "pull", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def printed(result: subprocess.CompletedProcess[str], label: str) -> Path:
    lines = [line for line in result.stdout.splitlines() if line.startswith(label + ": ")]
    assert len(lines) == 1, result.stdout
    return Path(lines[0].removeprefix(label + ": "))


@pytest.fixture(scope="module")
def first_pull(
    hub: HubImitation, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    cache = tmp_path_factory.mktemp("hub-cache")
    return pull(hub, cache, "owner/tiny:Q4_K_M"), cache


def test_first_pull_downloads_the_model_and_its_projector(
    hub: HubImitation, first_pull: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    result, cache = first_pull
    assert result.returncode == 0, result.stderr
    files = hub.repos["owner/tiny"]
    model, projector = printed(result, "model"), printed(result, "projector")
    assert model == cache / "owner--tiny" / MODEL
    assert sha256(model.read_bytes()) == files[MODEL].sha256
    assert sha256(projector.read_bytes()) == files[PROJECTOR].sha256
    assert not (cache / "owner--tiny" / OTHER).exists()
    # What happened, the progress bar (100% of the file) and the line to serve it with.
    assert f"{MODEL}: downloading {len(files[MODEL].data):,} bytes" in result.stderr
    assert "100%" in result.stderr
    assert f"sha256 {files[MODEL].sha256} verified" in result.stderr
    assert (
        f"serve it with: respd serve --model hf://owner/tiny:Q4_K_M --mmproj {projector}"
        in result.stdout
    )
    assert not list(cache.rglob("*.incomplete"))


def test_a_second_pull_is_a_cache_hit(
    hub: HubImitation, first_pull: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    first, cache = first_pull
    assert first.returncode == 0, first.stderr
    gets = len(hub.gets(MODEL))
    again = pull(hub, cache, "hf://owner/tiny:q4_k_m")
    assert again.returncode == 0, again.stderr
    assert printed(again, "model") == printed(first, "model")
    assert f"{MODEL}: cached at" in again.stderr and "no download" in again.stderr
    assert len(hub.gets(MODEL)) == gets  # the listing only, no file bytes
    # Offline, not even the listing: the cache alone answers.
    seen = len(hub.seen)
    offline = pull(hub, cache, "owner/tiny:Q4_K_M", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    assert printed(offline, "model") == printed(first, "model")
    assert len(hub.seen) == seen


def test_the_pulled_model_serves(
    first_pull: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    first, _ = first_pull
    assert first.returncode == 0, first.stderr
    model = printed(first, "model")
    srv = start_server(tmp_path, "--model", str(model), preset="compact")
    try:
        client = srv.client()
        model_id = client.models.list().data[0].id
        response = client.responses.create(model=model_id, input="Hello", max_output_tokens=8)
        assert response.status in ("completed", "incomplete")
        assert response.usage is not None and response.usage.input_tokens > 0
    finally:
        srv.stop()
    srv.assert_no_5xx()


def test_an_interrupted_download_resumes(hub: HubImitation, tmp_path: Path) -> None:
    """The first pull dies mid-file and keeps what it received; the second asks only for
    the rest (a `Range` request past 0) and ends with the verified file."""
    hub.cut_once(BIG, 12 * 1024 * 1024)
    try:
        failed = pull(hub, tmp_path, "owner/big")
    finally:
        hub.heal(BIG)
    assert failed.returncode == 1
    assert "pull again to resume" in failed.stderr
    final = tmp_path / "owner--big" / BIG
    assert not final.exists()
    (partial,) = final.parent.glob(f"{BIG}.*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < BIG_SIZE

    resumed = pull(hub, tmp_path, "owner/big:Q8_0")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at {kept:,} of {BIG_SIZE:,} bytes" in resumed.stderr
    assert hub.gets(BIG)[-1].range == f"bytes={kept}-"
    assert sha256(final.read_bytes()) == hub.repos["owner/big"][BIG].sha256
    assert not partial.exists()


def test_a_bad_checksum_is_refused(hub: HubImitation, tmp_path: Path) -> None:
    hub.corrupt.add(OTHER)
    try:
        result = pull(hub, tmp_path, f"owner/tiny:{OTHER}")
    finally:
        hub.corrupt.discard(OTHER)
    assert result.returncode == 1
    assert f"{OTHER}: checksum mismatch (expected {hub.repos['owner/tiny'][OTHER].sha256}" in (
        result.stderr
    )
    assert not (tmp_path / "owner--tiny" / OTHER).exists()
    assert not list(tmp_path.rglob("*.incomplete"))
    assert "model:" not in result.stdout


def test_offline_with_an_empty_cache_fails_clearly(hub: HubImitation, tmp_path: Path) -> None:
    seen = len(hub.seen)
    result = pull(hub, tmp_path, "owner/tiny:Q4_K_M", "--offline")
    assert result.returncode == 1
    assert "owner/tiny is not in the cache" in result.stderr
    assert "offline mode is on" in result.stderr
    assert len(hub.seen) == seen


def test_a_missing_quant_or_repo_says_what_there_is(hub: HubImitation, tmp_path: Path) -> None:
    result = pull(hub, tmp_path, "owner/tiny:Q5_K_M")
    assert result.returncode == 1
    assert "no GGUF for quant 'Q5_K_M'; available quants: Q4_K_M, Q8_0" in result.stderr
    result = pull(hub, tmp_path, "owner/absent")
    assert result.returncode == 1
    assert f"no model repository owner/absent at {hub.url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_hf_token_is_sent(hub: HubImitation, tmp_path: Path) -> None:
    seen = len(hub.seen)
    result = pull(hub, tmp_path, "owner/tiny:Q8_0", env={"HF_TOKEN": "hf_respdtest"})
    assert result.returncode == 0, result.stderr
    requests = hub.seen[seen:]
    on_hub = [r for r in requests if not r.path.startswith("/cdn-lfs/")]
    on_cdn = [r for r in requests if r.path.startswith("/cdn-lfs/")]
    assert on_hub and {r.authorization for r in on_hub} == {"Bearer hf_respdtest"}
    # The bytes come from the CDN's host, which never sees the token.
    assert on_cdn and {r.authorization for r in on_cdn} == {None}


def test_pull_in_process_reads_the_endpoint_when_called(
    hub: HubImitation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub was imported before `HF_ENDPOINT` was set here; the pull still goes
    to the imitation hub."""
    from respd import hub as respd_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    pulled = respd_hub.pull("hf://owner/tiny:Q8_0", cache_dir=tmp_path, progress=False)
    assert pulled.file == OTHER and pulled.sha256 == hub.repos["owner/tiny"][OTHER].sha256
    assert pulled.mmproj_path == tmp_path / "owner--tiny" / PROJECTOR
    path = respd_hub.resolve_model_ref("hf://owner/tiny:Q8_0", cache_dir=tmp_path)
    assert path == pulled.path


def test_the_imitation_answers_huggingface_hub_itself(hub: HubImitation, tmp_path: Path) -> None:
    """The library's own download (HEAD, redirect, GET) and tree listing work against the
    imitation, so it stays a faithful stand-in as the library changes."""
    from huggingface_hub import HfApi, hf_hub_download

    path = hf_hub_download("owner/tiny", MODEL, cache_dir=tmp_path, endpoint=hub.url)
    assert sha256(Path(path).read_bytes()) == hub.repos["owner/tiny"][MODEL].sha256
    listed = {f.path for f in HfApi(endpoint=hub.url).list_repo_tree("owner/tiny")}
    assert listed == set(hub.repos["owner/tiny"])


def test_serve_pulls_an_hf_model_with_its_projector(hub: HubImitation, tmp_path: Path) -> None:
    """`respd serve --model hf://…` pulls at start, serves the model under its repo's name,
    and loads the projector that came with it; a second, offline start needs no hub."""
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf-home"),
        "RESPD_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }

    def downloads() -> int:  # the module's other tests pull this file too
        return len([seen for seen in hub.gets(OTHER) if "/resolve/" in seen.path])

    before = downloads()
    for extra in ({}, {"HF_HUB_OFFLINE": "1"}):
        srv = start_server(
            tmp_path, "--model", "hf://owner/tiny:Q8_0", preset="compact", env={**env, **extra}
        )
        try:
            client = srv.client()
            card = client.models.list().data[0]
            assert card.id == "tiny"
            assert (card.model_extra or {})["input_modalities"] == ["text", "image"]
            answer = client.responses.create(model="tiny", input="Hello", max_output_tokens=4)
            assert answer.status in ("completed", "incomplete")
        finally:
            srv.stop()
        srv.assert_no_5xx()
    assert downloads() == before + 1  # pulled once, then found in the cache
