"""Streaming text while an image is encoded: `--image-encode inline` against `background`.

In-process (the engine with no HTTP server in front), with the embedded SmolLM2-135M and a
projector written here with the `gguf` package: a random-weight CLIP tower (ViT-L sized:
1024 wide, 24 blocks, f16) with an `mlp` projector, 448x448 input in 28-pixel patches.
Large patches keep the image at 256 prompt positions, so decoding its embeddings (which
stalls every sequence in both modes) stays short next to encoding it; one encode takes
about 1 s on two threads, 2 s on one (a 2-core EPYC), and the file is ~600 MB.

For each mode the benchmark streams 3 text requests (greedy, `ignore_eos`) and records when
each token arrives: first on their own, then while one more request sends a 2048x2048 image,
counting the gaps from that request's arrival to its first token. The two phases alternate
`--rounds` times (a new image each round), so drift in a noisy machine's speed lands on
both. It prints the pooled gaps' p50, p95 and max per mode and phase, the image request's
median time to first token, and p95 with the image over p95 without.

    .venv/bin/python bench/image_encode.py
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from respd.config import embedded_model_path  # noqa: E402
from respd.engines.base import (  # noqa: E402
    ChatMessage,
    GenerationDone,
    Image,
    SamplingParams,
    TokenChunk,
)
from respd.engines.llamacpp import LlamaCppEngine  # noqa: E402

Mode = Literal["inline", "background"]
TEXT_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "Describe a busy market in the morning.",
]


@dataclass(frozen=True)
class Tower:
    """Geometry of the CLIP vision tower written as the benchmark's projector."""

    image_size: int = 448
    patch_size: int = 28
    width: int = 1024
    layers: int = 24
    heads: int = 16
    ff: int = 4096
    proj_dim: int = 576  # SmolLM2-135M's embedding width

    @property
    def tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def write_projector(path: Path, t: Tower) -> Path:
    """A llava-style CLIP + `mlp` projector GGUF with random weights (as
    `tests/support/gguf/llava.py`, larger): matrices in f16, as real mmproj files hold them."""
    import gguf

    rng = np.random.default_rng(7)

    def mat(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), arch="clip")
    w.add_string("general.name", "respd-bench-vision-tower")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", t.image_size)
    w.add_uint32("clip.vision.patch_size", t.patch_size)
    w.add_uint32("clip.vision.embedding_length", t.width)
    w.add_uint32("clip.vision.feed_forward_length", t.ff)
    w.add_uint32("clip.vision.block_count", t.layers)
    w.add_uint32("clip.vision.attention.head_count", t.heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", t.proj_dim)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    # numpy shapes are torch's (out, in); ggml sees them reversed, as llama.cpp expects.
    w.add_tensor("v.patch_embd.weight", mat(t.width, 3, t.patch_size, t.patch_size))
    w.add_tensor("v.patch_embd.bias", vec(t.width))
    w.add_tensor(
        "v.position_embd.weight", (rng.standard_normal((t.tokens, t.width)) * 0.02).astype("f4")
    )
    w.add_tensor("v.pre_ln.weight", vec(t.width, 1.0))
    w.add_tensor("v.pre_ln.bias", vec(t.width))
    for il in range(t.layers):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{blk}.{name}.weight", mat(t.width, t.width))
            w.add_tensor(f"{blk}.{name}.bias", vec(t.width))
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"{blk}.{norm}.weight", vec(t.width, 1.0))
            w.add_tensor(f"{blk}.{norm}.bias", vec(t.width))
        w.add_tensor(f"{blk}.ffn_up.weight", mat(t.ff, t.width))
        w.add_tensor(f"{blk}.ffn_up.bias", vec(t.ff))
        w.add_tensor(f"{blk}.ffn_down.weight", mat(t.width, t.ff))
        w.add_tensor(f"{blk}.ffn_down.bias", vec(t.width))
    w.add_tensor("mm.0.weight", mat(t.proj_dim, t.width))
    w.add_tensor("mm.0.bias", vec(t.proj_dim))
    w.add_tensor("mm.2.weight", mat(t.proj_dim, t.proj_dim))
    w.add_tensor("mm.2.bias", vec(t.proj_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def big_image(seed: int, side: int = 2048) -> Image:
    """A `side`x`side` PNG, different for each seed (so no run finds it encoded already)."""
    from PIL import Image as PILImage

    y, x = np.mgrid[0:side, 0:side]
    rgb = np.stack([(x + seed * 37) % 256, (y + seed * 11) % 256, (x ^ y) % 256], axis=-1)
    buf = io.BytesIO()
    PILImage.fromarray(rgb.astype(np.uint8)).save(buf, format="PNG")
    return Image(buf.getvalue(), "image/png")


@dataclass
class Phase:
    """Token arrival times of the text streams, and the window the gaps are counted in."""

    stamps: list[list[float]] = field(default_factory=list)
    window: tuple[float, float] = (0.0, float("inf"))
    image_ttft: float | None = None

    def gaps_ms(self) -> list[float]:
        start, end = self.window
        return [
            (b - a) * 1000
            for times in self.stamps
            for a, b in itertools.pairwise(times)
            if b > start and a < end
        ]


async def run_phase(
    engine: LlamaCppEngine, image: Image | None, *, lead: int, tokens: int
) -> Phase:
    """Stream the text requests; with `image`, send it once each has `lead` tokens and stop
    at the image request's first token. Without, stop after `tokens` tokens."""
    params = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)
    phase = Phase(stamps=[[] for _ in TEXT_PROMPTS])
    stop = asyncio.Event()
    streams = [
        engine.generate(engine.prompt_of(text_tokens(engine, text)), params)
        for text in TEXT_PROMPTS
    ]

    async def read(i: int) -> None:
        async for event in streams[i]:
            if isinstance(event, TokenChunk):
                phase.stamps[i].append(time.monotonic())
            if stop.is_set() or isinstance(event, GenerationDone):
                return
            if image is None and len(phase.stamps[i]) >= tokens:
                return

    async def send_image() -> None:
        assert image is not None
        while min(len(s) for s in phase.stamps) < lead:
            await asyncio.sleep(0.005)
        prompt = engine.render_prompt([ChatMessage("user", ["Describe this.", image])])
        # Tokenized first (the server does it before admission too, off the worker).
        tokens = await asyncio.to_thread(engine.tokenize, prompt, [image])
        sent = time.monotonic()
        stream = engine.generate(engine.prompt_of(tokens, [image]), SamplingParams(max_tokens=1))
        async for event in stream:
            if isinstance(event, TokenChunk | GenerationDone):
                phase.window = (sent, time.monotonic())
                phase.image_ttft = phase.window[1] - sent
                break
        await stream.aclose()
        stop.set()

    jobs = [read(i) for i in range(len(streams))]
    await asyncio.gather(*jobs, *([send_image()] if image is not None else []))
    for stream in streams:
        await stream.aclose()
    return phase


def text_tokens(engine: LlamaCppEngine, text: str) -> list[int]:
    return engine.tokenize(engine.render_prompt([ChatMessage("user", text)]))


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def bench_mode(mode: Mode, mmproj: Path, args: argparse.Namespace) -> dict[str, list[Phase]]:
    engine = LlamaCppEngine(
        embedded_model_path(),
        model_id="bench",
        n_ctx=4096,
        n_threads=args.threads,
        parallel=len(TEXT_PROMPTS) + 1,
        mmproj=mmproj,
        image_encode=mode,
        image_threads=args.image_threads,
    )
    try:
        # Warm-up: the first encode allocates the tower's compute buffers.
        asyncio.run(run_phase(engine, big_image(1000), lead=2, tokens=0))
        out: dict[str, list[Phase]] = {"no image": [], "image": []}
        for n in range(args.rounds):
            out["no image"].append(asyncio.run(run_phase(engine, None, lead=0, tokens=args.tokens)))
            out["image"].append(
                asyncio.run(run_phase(engine, big_image(n + 1), lead=args.lead, tokens=0))
            )
        return out
    finally:
        engine.close()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--image-threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=150, help="tokens per stream, no image")
    p.add_argument("--lead", type=int, default=20, help="tokens per stream before the image")
    p.add_argument("--rounds", type=int, default=3, help="no-image/image phase pairs per mode")
    args = p.parse_args()
    tower = Tower()
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = write_projector(Path(tmp) / "mmproj-bench.gguf", tower)
        print(
            f"projector: CLIP {tower.width}x{tower.layers}, {tower.image_size}px / "
            f"{tower.patch_size}px patches = {tower.tokens} tokens; {args.threads} threads, "
            f"--image-threads {args.image_threads}; 3 text streams + one 2048x2048 image; "
            f"{args.rounds} rounds",
            flush=True,
        )
        rows = [
            ("mode", "phase", "gaps", "p50 ms", "p95 ms", "max ms", "image TTFT s", "p95 ratio")
        ]
        modes: tuple[Mode, ...] = ("inline", "background")
        for mode in modes:
            phases = bench_mode(mode, mmproj, args)
            base = pct([g for ph in phases["no image"] for g in ph.gaps_ms()], 95)
            for name, runs in phases.items():
                gaps = [g for ph in runs for g in ph.gaps_ms()]
                ttfts = [ph.image_ttft for ph in runs if ph.image_ttft is not None]
                rows.append(
                    (
                        mode,
                        name,
                        str(len(gaps)),
                        f"{pct(gaps, 50):.1f}",
                        f"{pct(gaps, 95):.1f}",
                        f"{max(gaps):.1f}",
                        f"{statistics.median(ttfts):.2f}" if ttfts else "-",
                        f"{pct(gaps, 95) / base:.2f}",
                    )
                )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if k == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
