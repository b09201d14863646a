"""A real, tiny Qwen2-VL-architecture model and projector for the M-RoPE vision tests,
written with `gguf` (llama.cpp's own GGUF writer).

The text model has llama.cpp's `qwen2vl` architecture: M-RoPE attention whose rotary
sections follow an image token's (time, row, column) coordinates, random weights from a fixed
seed and SmolLM2's tokenizer and chat template (copied from the embedded model, so no
download). The projector is a `qwen2vl_merger` vision tower: two patch convolutions, blocks
with 2-D M-RoPE attention, and a merger that joins 2x2 neighbouring patches into one
embedding of the text model's width. Images keep their aspect ratio (dynamic resolution): a
W x H image becomes about (W/16) x (H/16) image tokens, and takes max(W, H)/16 positions.

Everything is small (a 64-wide, 2-layer text model; a 32-wide, 2-layer tower), so loading,
encoding and decoding take milliseconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.gguf.llava import add_vit_blocks, ones, zeros
from tests.support.gguf.tokenizer import copy_tokenizer

# Text model.
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
N_CTX = 4096
# Rotary pairs per head (head size 16 → 8 pairs) split over time, rows, columns and a spare.
ROPE_SECTIONS = [2, 3, 3, 0]

# Vision tower.
PATCH_SIZE = 8
MERGE = 2  # 2x2 patches become one image token
V_EMBD = 32
V_HEAD = 2
V_FF = 48
V_LAYER = 2
SEED = 4321

# One image token covers this many pixels on each side.
TOKEN_SIDE = PATCH_SIZE * MERGE


def _rng(salt: int) -> np.random.Generator:
    return np.random.default_rng(SEED + salt)


def write_qwen2vl_model(path: Path, tokenizer_from: Path) -> Path:
    """Write the text model to `path`, with the tokenizer and template of `tokenizer_from`."""
    import gguf

    rng = _rng(0)

    def rand(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head = N_EMBD // N_HEAD
    w = gguf.GGUFWriter(str(path), arch="qwen2vl")
    w.add_string("general.name", "respd-test-qwen2vl")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_sections(ROPE_SECTIONS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    n_vocab = copy_tokenizer(w, tokenizer_from)

    w.add_tensor("token_embd.weight", rand(n_vocab, N_EMBD, scale=0.5))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    kv = N_HEAD_KV * head
    for il in range(N_LAYER):
        blk = f"blk.{il}"
        w.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{blk}.attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"{blk}.attn_q.bias", rand(N_EMBD, scale=0.02))
        w.add_tensor(f"{blk}.attn_k.weight", rand(kv, N_EMBD))
        w.add_tensor(f"{blk}.attn_k.bias", rand(kv, scale=0.02))
        w.add_tensor(f"{blk}.attn_v.weight", rand(kv, N_EMBD))
        w.add_tensor(f"{blk}.attn_v.bias", rand(kv, scale=0.02))
        w.add_tensor(f"{blk}.attn_output.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"{blk}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_down.weight", rand(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_qwen2vl_projector(path: Path) -> Path:
    """Write the `qwen2vl_merger` projector GGUF for the model above."""
    import gguf

    rng = _rng(1)

    def rand(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    merged = V_EMBD * MERGE * MERGE
    w = gguf.GGUFWriter(str(path), arch="clip")
    w.add_string("general.name", "respd-test-qwen2vl-vision")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", 560)
    w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", V_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", V_FF)
    w.add_uint32("clip.vision.block_count", V_LAYER)
    w.add_uint32("clip.vision.attention.head_count", V_HEAD)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", N_EMBD)
    w.add_uint32("clip.vision.spatial_merge_size", MERGE)
    w.add_array("clip.vision.image_mean", [0.48, 0.46, 0.41])
    w.add_array("clip.vision.image_std", [0.27, 0.26, 0.28])

    # Two convolutions over the same frame (Qwen2-VL's temporal patch of a still image).
    w.add_tensor("v.patch_embd.weight", rand(V_EMBD, 3, PATCH_SIZE, PATCH_SIZE))
    w.add_tensor("v.patch_embd.weight.1", rand(V_EMBD, 3, PATCH_SIZE, PATCH_SIZE))
    add_vit_blocks(w, V_LAYER, V_EMBD, V_FF, rand)
    w.add_tensor("v.post_ln.weight", ones(V_EMBD))
    w.add_tensor("v.post_ln.bias", zeros(V_EMBD))
    # The merger: 2x2 patches (4 x 32 wide) → linear → GELU → linear into the text width.
    w.add_tensor("mm.0.weight", rand(merged, merged))
    w.add_tensor("mm.0.bias", zeros(merged))
    w.add_tensor("mm.2.weight", rand(N_EMBD, merged, scale=0.3))
    w.add_tensor("mm.2.bias", zeros(N_EMBD))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
