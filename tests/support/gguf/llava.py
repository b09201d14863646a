"""A real, tiny multimodal projector GGUF for the vision tests, written with `gguf` (llama.cpp's
own GGUF writer).

It is a LLaVA-style CLIP vision tower with an `mlp` projector (llama.cpp's projector type
"mlp": linear → GELU → linear), random weights from a fixed seed, whose output size equals the
text model's embedding size (SmolLM2-135M: 576), so llama.cpp's multimodal library (mtmd)
loads it against the embedded text model like any LLaVA mmproj file. The `mlp` type needs no
special tokens in the text vocabulary (idefics3 would want `<fake_token_around_image>`, which
SmolLM2's vocabulary lacks), and it resizes every image to one fixed square.

Geometry: a 64x64 RGB input cut into 16x16 patches → a 4x4 grid → 16 image tokens per image;
a 64-wide, 2-block encoder (llava runs all but the last block) and a 576-wide projector.
Encoding one image takes a few milliseconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SIZE = 64
PATCH_SIZE = 16
N_EMBD = 64  # vision tower width
N_HEAD = 4
N_FF = 128
N_LAYER = 2
PROJ_DIM = 576  # = n_embd of SmolLM2-135M, the default text model
SEED = 1234

# Every image, whatever its size, becomes this many embeddings in the prompt.
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2


def ones(n: int) -> np.ndarray:
    """A float32 vector of ones (a layer norm's weight); `zeros`, of zeros (a bias)."""
    return np.ones(n, dtype=np.float32)


def zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float32)


def add_vit_blocks(
    w: Any, layers: int, width: int, ff: int, rand: Callable[..., np.ndarray]
) -> None:
    """Add a CLIP-style vision tower's transformer blocks (`v.blk.N.*`) to GGUF writer `w`:
    biased attention projections, two layer norms, a biased MLP; `rand(*shape)` gives the
    random matrices, in the order the blocks are written."""
    for il in range(layers):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{blk}.{name}.weight", rand(width, width))
            w.add_tensor(f"{blk}.{name}.bias", zeros(width))
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"{blk}.{norm}.weight", ones(width))
            w.add_tensor(f"{blk}.{norm}.bias", zeros(width))
        w.add_tensor(f"{blk}.ffn_up.weight", rand(ff, width))
        w.add_tensor(f"{blk}.ffn_up.bias", zeros(ff))
        w.add_tensor(f"{blk}.ffn_down.weight", rand(width, ff))
        w.add_tensor(f"{blk}.ffn_down.bias", zeros(width))


def write_projector(path: Path, *, proj_dim: int = PROJ_DIM) -> Path:
    """Write the projector GGUF to `path` (same bytes every time for the same arguments)."""
    import gguf  # the test extra; imported here so collecting the tests never needs it

    rng = np.random.default_rng(SEED)

    def rand(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch="clip")
    w.add_string("general.name", "respd-test-vision-tower")
    w.add_string("general.description", "tiny random-weight CLIP + mlp projector for tests")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", N_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", N_FF)
    w.add_uint32("clip.vision.block_count", N_LAYER)
    w.add_uint32("clip.vision.attention.head_count", N_HEAD)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", proj_dim)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    n_patches = IMAGE_SIZE // PATCH_SIZE
    # numpy shapes are torch's (out, in); ggml sees them reversed, as llama.cpp expects.
    w.add_tensor("v.patch_embd.weight", rand(N_EMBD, 3, PATCH_SIZE, PATCH_SIZE))
    w.add_tensor("v.patch_embd.bias", zeros(N_EMBD))
    w.add_tensor("v.position_embd.weight", rand(n_patches * n_patches, N_EMBD))
    w.add_tensor("v.pre_ln.weight", ones(N_EMBD))
    w.add_tensor("v.pre_ln.bias", zeros(N_EMBD))
    add_vit_blocks(w, N_LAYER, N_EMBD, N_FF, rand)
    # The llava projector: mm.0 (linear), GELU, mm.2 (linear) into the text embedding space.
    w.add_tensor("mm.0.weight", rand(proj_dim, N_EMBD))
    w.add_tensor("mm.0.bias", zeros(proj_dim))
    w.add_tensor("mm.2.weight", rand(proj_dim, proj_dim, scale=0.02))
    w.add_tensor("mm.2.bias", zeros(proj_dim))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def png_bytes(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """A small PNG with a colour gradient (so different colours give different pixels)."""
    import io

    from PIL import Image

    img = Image.new("RGB", size, color)
    px = img.load()
    assert px is not None
    for x in range(size[0]):
        for y in range(size[1]):
            r, g, b = color
            px[x, y] = ((r + 3 * x) % 256, (g + 5 * y) % 256, (b + x * y) % 256)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
