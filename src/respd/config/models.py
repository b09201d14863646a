"""The flags of serving several local models: where they come from, how many stay loaded,
and when an idle one is unloaded."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class ModelsConfig(BaseModel):
    model_config = ConfigDict(title="Several local models")

    models_dir: Path | None = Field(
        None,
        description="A directory of GGUF models: each *.gguf is a model under its file name's "
        "alias (mmproj-NAME.gguf is NAME's vision projector), loaded on first use.",
    )
    models_file: Path | None = Field(
        None,
        description="A TOML file of model presets: [[model]] tables with alias and path (a file, "
        "or hf://OWNER/REPO[:QUANT]) or naming a --models-dir model by alias, and per-model "
        "settings: ctx_size, parallel, threads, batch_size, chat_template, mmproj, "
        "speculation, jump_forward, temperature, top_p, top_k, min_p, repeat_penalty, pin, ttl.",
    )
    models_max: int = Field(
        0,
        ge=0,
        description="Local models loaded at once; loading one more first unloads the least "
        "recently used that is not pinned and runs no request. 0: no limit.",
    )
    models_memory_mb: int = Field(
        0,
        ge=0,
        description="MiB the loaded local models may take together (estimated from each GGUF's "
        "size and its KV cache before loading); the least recently used idle ones are "
        "unloaded to make room. 0: no limit.",
    )
    models_idle_secs: float = Field(
        0.0,
        ge=0.0,
        description="Unload a local model idle this long (a preset's ttl overrides it; pinned "
        "models stay). 0: never.",
    )
