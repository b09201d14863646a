"""Token index → KV position of a request: one per token, except that an image on an
M-RoPE model takes fewer positions (max(rows, columns)) than tokens."""

from __future__ import annotations

import asyncio
from typing import Any

from respd.engines.base import SamplingParams
from respd.engines.llamacpp.jobs import Job
from respd.engines.llamacpp.multimodal import ImageChunk
from respd.engines.llamacpp.outbox import Outbox


def job(prompt_len: int, images: list[tuple[int, int, int]]) -> Job:
    """A job whose prompt holds images `(start, n_tokens, n_pos)`."""
    owner: Any = None
    chunks = [(s, ImageChunk(0, n, p, [-1] * n, owner)) for s, n, p in images]
    loop = asyncio.new_event_loop()
    try:
        return Job(
            [1] * prompt_len, SamplingParams(), None, None, loop, asyncio.Queue(), Outbox(),
            images=chunks,
        )  # fmt: skip
    finally:
        loop.close()


def test_without_grid_images_the_position_is_the_index() -> None:
    j = job(20, [(3, 4, 4)])
    assert [j.position(i) for i in (0, 3, 7, 19, 20, 25)] == [0, 3, 7, 19, 20, 25]


def test_a_grid_image_shifts_everything_after_it() -> None:
    # 12 tokens (a 4x3 grid) at index 2 take 4 positions: 2..5; the text after starts at 6.
    j = job(20, [(2, 12, 4)])
    assert j.position(2) == 2  # the image's start (where a reused prefix may end)
    assert j.position(14) == 6  # the first token after it
    assert j.position(19) == 11  # the last prompt token
    assert j.position(20) == 12  # generated tokens follow on
    assert j.position(30) == 22


def test_two_images_add_their_shifts() -> None:
    j = job(40, [(1, 12, 4), (20, 6, 3)])
    assert j.position(13) == 5
    assert j.position(20) == 12
    assert j.position(26) == 15
    assert j.position(40) == 29
