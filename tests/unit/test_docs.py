"""The manual's generated pages match the code they are generated from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from respd.cli import serve_help
from respd.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_flags_doc", ROOT / "scripts/gen_flags_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flags_page_is_regenerated_unchanged() -> None:
    gen = _generator()
    assert gen.PAGE.read_text() == gen.render(), "run scripts/gen_flags_doc.py"


def test_flags_page_holds_what_serve_help_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page quotes `serve_help()` whole, at the page's terminal width, and has a row per
    flag. That `serve_help()` is what the command prints is `test_cli`'s check: it runs
    the command once."""
    gen = _generator()
    for name, value in gen.HELP_ENV.items():
        monkeypatch.setenv(name, value)
    page = gen.PAGE.read_text()
    assert f"```text\n{serve_help()}```" in page
    for name in Settings.model_fields:
        assert f"| `--{name.replace('_', '-')}` |" in page
        assert f"| `RESPD_{name.upper()}` |" in page


def test_client_matrix_page_is_rendered_from_the_record() -> None:
    from tests.clients import matrix

    assert matrix.page_section(matrix.PAGE.read_text()) == matrix.render(matrix.load())
