"""SmolLM2's tokenizer copied into a test-made GGUF (from the embedded model: no download)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

_FIELDS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template",
)


@functools.cache
def _fields(source: Path) -> dict[str, Any]:
    """The tokenizer's fields, read once per process: `GGUFReader` takes seconds to parse
    a 100 MB file."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    return {name: reader.fields[name].contents() for name in _FIELDS}


def copy_tokenizer(writer: Any, source: Path, *, chat_template: bool = True) -> int:
    """Write `source`'s tokenizer (and its chat template) with `writer`, a
    `gguf.GGUFWriter`; returns the vocabulary's size."""
    field = _fields(source)
    tokens = field["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    writer.add_tokenizer_model(str(field["tokenizer.ggml.model"]))
    writer.add_tokenizer_pre(str(field["tokenizer.ggml.pre"]))
    writer.add_token_list(tokens)
    writer.add_token_types(list(field["tokenizer.ggml.token_type"]))
    writer.add_token_merges(list(field["tokenizer.ggml.merges"]))
    writer.add_bos_token_id(int(field["tokenizer.ggml.bos_token_id"]))
    writer.add_eos_token_id(int(field["tokenizer.ggml.eos_token_id"]))
    writer.add_pad_token_id(int(field["tokenizer.ggml.padding_token_id"]))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(str(field["tokenizer.chat_template"]))
    return len(tokens)
