"""A GGUF header read without loading the model: the facts a model pool lists and sizes a
model by, and a clear error (never a huge allocation) for a corrupt file."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from respd.engines.llamacpp.gguf_meta import GGUFError, model_facts, read_metadata


def _write(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(4)
    writer.add_embedding_length(64)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_context_length(2048)
    writer.add_token_list([f"t{i}" for i in range(300)])  # an array of strings, skipped
    writer.add_token_scores([0.0] * 300)
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_facts_of_a_model(tmp_path: Path) -> None:
    path = _write(tmp_path / "tiny.gguf")
    meta = read_metadata(path)
    assert meta["general.architecture"] == "llama" and "tokenizer.ggml.tokens" not in meta
    facts = model_facts(path)
    assert facts.trained_context == 2048
    # 4 layers x 2 KV heads x (8 + 8) dims x 2 bytes
    assert facts.kv_bytes_per_token == 4 * 2 * 16 * 2
    assert facts.memory_bytes(1000, 10) == 1000 + 10 * facts.kv_bytes_per_token


@pytest.mark.parametrize(
    "content",
    [b"not a gguf", b"GGUF\x03\x00\x00\x00" + os.urandom(2048), b"GGUF\x03\x00\x00\x00"],
)
def test_a_corrupt_file_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError):
        model_facts(path)
