"""SmolLM2's tokenizer copied into a test-made GGUF (from the embedded model: no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def copy_tokenizer(writer: Any, source: Path, *, chat_template: bool = True) -> int:
    """Write `source`'s tokenizer (and its chat template) with `writer`, a
    `gguf.GGUFWriter`; returns the vocabulary's size."""
    import gguf

    src = gguf.GGUFReader(str(source))

    def field(name: str) -> Any:
        return src.fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    writer.add_tokenizer_model(str(field("tokenizer.ggml.model")))
    writer.add_tokenizer_pre(str(field("tokenizer.ggml.pre")))
    writer.add_token_list(tokens)
    writer.add_token_types(list(field("tokenizer.ggml.token_type")))
    writer.add_token_merges(list(field("tokenizer.ggml.merges")))
    writer.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    writer.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    writer.add_pad_token_id(int(field("tokenizer.ggml.padding_token_id")))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(str(field("tokenizer.chat_template")))
    return len(tokens)
