"""The KV cache is resident only where sequences use it: llama.cpp clears the whole buffer
when it creates the context, and the engine hands those zero pages back."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, PromptRequest, SamplingParams
from tests.support.engine import collect, embedded_engine

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="pages are handed back on Linux only"
)

# SmolLM2-135M: 30 layers, K and V of 3 heads x 64 in f16 for each cell.
KV_BYTES_PER_CELL = 30 * 2 * 3 * 64 * 2


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_kv_pages_stay_out_of_memory_until_used() -> None:
    n_ctx, parallel = 2048, 8
    kv_mib = n_ctx * parallel * KV_BYTES_PER_CELL / 2**20  # 360 MiB
    model_mib = embedded_model_path().stat().st_size / 2**20  # its mapping becomes resident
    base = resident_mib() + model_mib  # resident whatever the KV cache does
    engine = embedded_engine(n_ctx=n_ctx, parallel=parallel)
    try:
        loaded = resident_mib()
        # The model and the engine's buffers stay (some 20 MiB past the model's file); the
        # cleared KV buffer does not.
        assert loaded - base < kv_mib / 4, (base, loaded, kv_mib)

        async def main() -> list[str]:
            prompts = [
                await engine.prepare(PromptRequest([ChatMessage("user", f"Count to {i}.")]))
                for i in range(parallel)
            ]
            outs = await asyncio.gather(
                *(collect(engine, p, SamplingParams(temperature=0, max_tokens=24)) for p in prompts)
            )
            return [o.text for o in outs]

        texts = asyncio.run(main())
        assert all(texts), texts  # sequences decode in what were released pages
        # Eight short sequences use a few hundred cells of the 16k.
        assert resident_mib() - base < kv_mib / 2, (base, resident_mib(), kv_mib)
    finally:
        engine.close()
