"""Settings checks that need no server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from respd.config import Settings


def test_speculation_ngram_range_must_not_be_empty() -> None:
    with pytest.raises(ValidationError, match="speculation-ngram-min"):
        Settings(speculation="ngram", speculation_ngram_min=6, speculation_ngram_max=4)
    ok = Settings(speculation="ngram", speculation_ngram_min=4, speculation_ngram_max=4)
    assert (ok.speculation_ngram_min, ok.speculation_ngram_max) == (4, 4)


def test_speculation_reads_its_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPD_SPECULATION", "ngram")
    monkeypatch.setenv("RESPD_SPECULATION_DRAFT_MAX", "12")
    settings = Settings()
    assert settings.speculation == "ngram" and settings.speculation_draft_max == 12
    monkeypatch.setenv("RESPD_SPECULATION", "eagle")
    with pytest.raises(ValidationError):
        Settings()
