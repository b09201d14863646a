"""The local models a server may load: repeatable `--model` entries, every GGUF of
`--models-dir`, and `--models-file` presets (new models, or settings for those found),
each with the settings its engine loads with and an estimate of its memory."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from respd.config import Settings
from respd.config.engine import alias_from_path, alias_from_ref
from respd.engines.base import Engine
from respd.hub import resolve_model_files
from respd.service.models import LocalModel


class ModelsError(Exception):
    """A models file, directory or entry is wrong: start-up stops with the reason."""


class ModelPreset(BaseModel):
    """One `[[model]]` table: the model and the settings its engine loads with."""

    model_config = ConfigDict(extra="forbid")

    alias: str
    path: str | None = None  # absent: settings for a model found otherwise, by alias
    mmproj: Path | None = None
    pin: bool = False
    ttl: float | None = Field(None, ge=0)
    ctx_size: int | None = Field(None, ge=64)
    parallel: int | None = Field(None, ge=1, le=64)
    threads: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    max_queue: int | None = Field(None, ge=0)
    kv_cache_ram_mb: int | None = Field(None, ge=0)
    chat_template: Path | None = None
    speculation: Literal["off", "ngram"] | None = None
    jump_forward: Literal["auto", "on", "off"] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, ge=0)

    def overrides(self) -> dict[str, Any]:
        """The engine settings the preset sets."""
        return self.model_dump(exclude_none=True, exclude={"alias", "path", "pin", "ttl"})


@dataclass
class ModelEntry:
    alias: str
    ref: str  # a file, or an hf:// reference
    settings: dict[str, Any] = field(default_factory=dict)
    pin: bool = False
    ttl: float | None = None
    primary: bool = False  # the first --model: the server-wide --mmproj is its projector


def read_presets(path: Path) -> list[ModelPreset]:
    try:
        data = tomllib.loads(path.expanduser().read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ModelsError(f"cannot read --models-file {path}: {exc}") from None
    unknown = sorted(set(data) - {"model"})
    if unknown or not isinstance(data.get("model", []), list):
        raise ModelsError(f"--models-file {path}: expected only [[model]] tables, not {unknown}")
    presets = []
    for i, table in enumerate(data.get("model", [])):
        try:
            presets.append(ModelPreset.model_validate(table))
        except ValidationError as exc:
            raise ModelsError(f"--models-file {path}: model #{i + 1}: {exc}") from None
    return presets


def model_entries(settings: Settings) -> list[ModelEntry]:
    """Every local model, in order: --model entries, --models-dir files, new presets."""
    entries: dict[str, ModelEntry] = {}

    def add(entry: ModelEntry) -> None:
        if entry.alias in entries:
            raise ModelsError(f"two local models are called {entry.alias!r}")
        entries[entry.alias] = entry

    for i, (alias, ref) in enumerate(settings.model_entries()):
        add(ModelEntry(alias or alias_from_ref(ref), ref, primary=i == 0))
    if settings.models_dir is not None:
        folder = settings.models_dir.expanduser()
        if not folder.is_dir():
            raise ModelsError(f"--models-dir {folder} is not a directory")
        files = sorted(folder.glob("*.gguf"))
        projectors = {p.name.lower(): p for p in files if p.name.lower().startswith("mmproj")}
        for path in files:
            if path.name.lower() in projectors:
                continue
            entry = ModelEntry(alias_from_path(path), str(path))
            for name in (f"mmproj-{path.name}", f"mmproj-{entry.alias}.gguf"):
                if name.lower() in projectors:
                    entry.settings["mmproj"] = projectors[name.lower()]
            add(entry)
    if settings.models_file is not None:
        for preset in read_presets(settings.models_file):
            found = entries.get(preset.alias)
            if found is not None:
                entry = found
                if preset.path is not None:
                    entry.ref = preset.path
            else:
                if preset.path is None:
                    raise ModelsError(
                        f"--models-file: model {preset.alias!r} has no path and no model of "
                        "that alias was found (--model, --models-dir)"
                    )
                entry = ModelEntry(preset.alias, preset.path)
                add(entry)
            entry.settings.update(preset.overrides())
            entry.pin, entry.ttl = preset.pin, preset.ttl
    return list(entries.values())


def several(settings: Settings) -> bool:
    """Whether the local models make a pool (loaded on first use) rather than the one model
    loaded at start."""
    return (
        len(settings.model) > 1
        or settings.models_dir is not None
        or settings.models_file is not None
    )


def entry_settings(settings: Settings, entry: ModelEntry, path: Path) -> Settings:
    """The server's settings as this model's engine loads with them."""
    update: dict[str, Any] = {
        "model": [str(path)],
        "model_alias": entry.alias,
        "mmproj": settings.mmproj if entry.primary else None,
        **entry.settings,
    }
    if settings.kv_cache_dir is not None:  # each model's saved KV states apart
        update["kv_cache_dir"] = settings.kv_cache_dir.expanduser() / entry.alias
    return settings.model_copy(update=update)


def _loader(load: Callable[[Settings], Engine], own: Settings) -> Callable[[], Engine]:
    def run() -> Engine:
        try:
            return load(own)
        except SystemExit as exc:  # the loader's start-up refusal: here, one model's failure
            raise RuntimeError(str(exc.code).removeprefix("respd: ")) from None

    return run


def local_models(settings: Settings, load: Callable[[Settings], Engine]) -> list[LocalModel]:
    """A `LocalModel` per entry; `load` builds an engine from a model's own settings."""
    from respd.engines.llamacpp.gguf_meta import GGUFError, model_facts

    models = []
    for entry in model_entries(settings):
        try:
            path, projector = resolve_model_files(entry.ref)
        except Exception as exc:  # an hf:// model that cannot be pulled
            raise ModelsError(f"model {entry.alias}: {exc}") from None
        if projector is not None:  # pulled with it, unless a preset names another
            entry.settings.setdefault("mmproj", projector)
        if not path.is_file():
            raise ModelsError(f"model {entry.alias}: file not found: {path}")
        own = entry_settings(settings, entry, path)
        kv_tokens = own.ctx_size * own.parallel
        try:
            memory = model_facts(path).memory_bytes(path.stat().st_size, kv_tokens)
        except (GGUFError, OSError):  # unreadable: it fails when loaded, alone
            memory = path.stat().st_size
        models.append(
            LocalModel(
                entry.alias,
                _loader(load, own),
                memory_bytes=memory,
                context_window=own.ctx_size,
                vision=own.mmproj is not None,
                slots=own.parallel,
                pin=entry.pin,
                ttl=entry.ttl,
                source=str(path),
            )
        )
    return models
