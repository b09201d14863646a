"""The `respd` command line and its settings, down to the generated flag reference (no model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from respd import __version__
from respd.cli import build_parser, main, serve_help, settings_from_args
from respd.config import Settings


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command in its own process: what a shell runs."""
    return subprocess.run(
        [sys.executable, "-m", "respd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line's entry point in this process: its exit status, stdout and stderr
    (argparse exits for --help and for usage errors alike)."""
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out = capsys.readouterr()
    return int(exited.value.code or 0), out.out, out.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, stdout, _ = _main(capsys, "--version")
    assert status == 0
    assert stdout.strip() == f"respd {__version__}"


def test_serve_help_documents_every_flag_and_env_var(capsys: pytest.CaptureFixture[str]) -> None:
    status, stdout, _ = _main(capsys, "serve", "--help")
    assert status == 0
    text = " ".join(stdout.split())
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


def test_invalid_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, stderr = _main(capsys, "serve", "--port", "-3")
    assert status == 2
    assert "port" in stderr


def test_missing_model_file_fails_clearly(tmp_path: Path) -> None:
    out = _run("serve", "--model", str(tmp_path / "nope.gguf"), "--port", "0")
    assert out.returncode != 0
    assert "model file not found" in out.stderr


def test_unreachable_postgres_is_a_clear_startup_error(tmp_path: Path) -> None:
    """A database that cannot be reached stops start-up with the driver's reason, before
    the model loads, and the password never reaches the terminal."""
    spec = "postgresql://respd:hunter2@127.0.0.1:1/respd"
    result = subprocess.run(
        [sys.executable, "-m", "respd", "serve", "--store", spec],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cannot connect to --store postgresql://respd:***@127.0.0.1:1/respd" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_flag_reference_documents_every_flag() -> None:
    """The generated flag reference (docs/reference/flags.md) names every flag and variable."""
    page = (Path(__file__).resolve().parents[2] / "docs/reference/flags.md").read_text()
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in page
        assert f"`RESPD_{name.upper()}`" in page
