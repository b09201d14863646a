"""A GGUF file's header metadata, read without loading the model: what a model pool
needs to list a model and to estimate its memory before loading it. Arrays (the
tokenizer's vocabulary) are skipped, not decoded, so reading takes milliseconds."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
# GGUF value types: their struct formats (strings and arrays are read apart).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
KV_BYTES_PER_VALUE = 2  # llama.cpp's default KV cache type, f16


class GGUFError(ValueError):
    """Not a GGUF file, or one cut short."""


def _read(f: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("the file ends inside its header")
    return struct.unpack(fmt, data)[0]


def _room(f: IO[bytes], n: int) -> None:
    """A length the rest of the file can hold (a corrupt one may claim any)."""
    here = f.tell()
    end = f.seek(0, 2)
    f.seek(here)
    if n > end - here:
        raise GGUFError("a length in the header runs past the end of the file")


def _string(f: IO[bytes]) -> str:
    n = _read(f, "<Q")
    _room(f, n)
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("the file ends inside a string")
    return data.decode("utf-8", errors="replace")


def _value(f: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        inner, count = _read(f, "<I"), _read(f, "<Q")
        if inner in _SCALARS:
            size = struct.calcsize(_SCALARS[inner]) * count
            _room(f, size)
            f.seek(size, 1)
        elif inner == _STRING:
            _room(f, 8 * count)
            for _ in range(count):
                n = _read(f, "<Q")
                _room(f, n)
                f.seek(n, 1)
        else:
            for _ in range(count):
                _value(f, inner)
        return None  # arrays are not kept
    raise GGUFError(f"unknown GGUF value type {kind}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The header's scalar and string values, by key."""
    with path.open("rb") as f:
        if f.read(4) != MAGIC:
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise GGUFError(f"{path.name}: GGUF version {version} is not supported")
        _read(f, "<Q")  # tensor count
        n_kv = _read(f, "<Q")
        _room(f, n_kv)  # each pair takes more than a byte
        values: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f)
            value = _value(f, _read(f, "<I"))
            if value is not None:
                values[key] = value
        return values


@dataclass(frozen=True)
class ModelFacts:
    """What a GGUF says about itself, for listing and memory estimates."""

    architecture: str
    trained_context: int | None
    kv_bytes_per_token: int | None  # every layer's K and V for one token, in f16

    def memory_bytes(self, file_bytes: int, kv_tokens: int) -> int:
        """Weights (mapped from the file) plus a KV cache of `kv_tokens` positions."""
        return file_bytes + (self.kv_bytes_per_token or 0) * kv_tokens


def model_facts(path: Path) -> ModelFacts:
    meta = read_metadata(path)
    arch = str(meta.get("general.architecture", "unknown"))

    def number(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int | float) else None

    layers, embd, heads = (
        number("block_count"),
        number("embedding_length"),
        number("attention.head_count"),
    )
    kv_heads = number("attention.head_count_kv") or heads
    per_token = None
    if layers and embd and heads and kv_heads:
        head_k = number("attention.key_length") or embd // heads
        head_v = number("attention.value_length") or embd // heads
        per_token = layers * kv_heads * (head_k + head_v) * KV_BYTES_PER_VALUE
    return ModelFacts(arch, number("context_length"), per_token)
