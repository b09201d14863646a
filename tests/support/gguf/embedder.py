"""A real, tiny embedding GGUF for the `/v1/embeddings` tests, written with `gguf`.

A llama-architecture model that declares mean pooling (`llama.pooling_type`), as embedding
GGUFs do, with SmolLM2's tokenizer (copied from the embedded model, so no download). Its
one block's weights are zero, so each token's hidden state is its own embedding row (random
from a fixed seed) and the pooled vector is the mean of a text's token rows: a bag of
tokens. Two texts that share most of their tokens point nearly the same way, and a text with
none in common points elsewhere — a similarity that can be asserted, in milliseconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.gguf.tokenizer import copy_tokenizer

N_EMBD = 64
N_HEAD = 4
N_FF = 64
N_CTX = 2048
MEAN_POOLING = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN
SEED = 2024


def write_embedding_model(path: Path, tokenizer_from: Path) -> Path:
    import gguf

    rng = np.random.default_rng(SEED)
    zero = np.zeros

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.name", "respd-test-embedder")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_pooling_type(gguf.PoolingType(MEAN_POOLING))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = copy_tokenizer(w, tokenizer_from, chat_template=False)

    rows = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    w.add_tensor("token_embd.weight", rows)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", zero((N_EMBD, N_EMBD), dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", zero((N_FF, N_EMBD), dtype=np.float32))
    w.add_tensor("blk.0.ffn_up.weight", zero((N_FF, N_EMBD), dtype=np.float32))
    w.add_tensor("blk.0.ffn_down.weight", zero((N_EMBD, N_FF), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
