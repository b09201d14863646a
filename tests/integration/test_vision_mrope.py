"""Image input on an M-RoPE model (the Qwen2/2.5/3-VL family), with a real random-weight
`qwen2vl` text model and `qwen2vl_merger` projector the tests write
(`tests/support/gguf/qwen2vl.py`).

An image's tokens sit on a grid: they take max(rows, columns) positions, not one per token,
so everything after an image is decoded at a position below its index in the token list.
The in-process part checks the engine against llama.cpp's own multimodal evaluation
(`mtmd_helper_eval_chunks` on a fresh context); the server part goes through `respd serve`
and the `openai` SDK on both APIs.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import openai
import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, Image, SamplingParams
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.prompting import MEDIA_MARKER
from tests.support.engine import Output, capture_first_logits, collect
from tests.support.gguf.llava import png_bytes
from tests.support.gguf.qwen2vl import TOKEN_SIDE, write_qwen2vl_model, write_qwen2vl_projector
from tests.support.servers import RespdServer, start_server

MODEL = "qwen2vl-test"
# 64x48 pixels → a 4x3 grid of image tokens: 12 tokens over 4 positions.
RED = Image(png_bytes((200, 20, 20), size=(64, 48)), "image/png")
BLUE = Image(png_bytes((20, 20, 220), size=(64, 48)), "image/png")
# 96x32 → a 6x2 grid: 12 tokens over 6 positions.
WIDE = Image(png_bytes((30, 160, 60), size=(96, 32)), "image/png")
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("qwen2vl")
    return (
        write_qwen2vl_model(d / "qwen2vl-test.gguf", embedded_model_path()),
        write_qwen2vl_projector(d / "mmproj-qwen2vl-test.gguf"),
    )


@pytest.fixture(scope="module")
def engine(files: tuple[Path, Path]) -> Iterator[LlamaCppEngine]:
    model, mmproj = files
    eng = LlamaCppEngine(model, model_id=MODEL, n_ctx=2048, n_threads=2, parallel=3, mmproj=mmproj)
    yield eng
    eng.close()


def prompt_of(
    engine: LlamaCppEngine, text: str, images: Sequence[Image] = (), *, after: str = ""
) -> list[int]:
    """One user turn: `text`, then each image on its own line, then `after`."""
    content = "\n".join([text, *(MEDIA_MARKER for _ in images)]) + after
    return engine.tokenize(engine.render_prompt([ChatMessage("user", content)]), images)


def run(
    engine: LlamaCppEngine,
    jobs: Sequence[tuple[list[int], Sequence[Image]]],
    params: SamplingParams = GREEDY,
) -> list[Output]:
    async def all_of_them() -> list[Output]:
        return await asyncio.gather(
            *(collect(engine, engine.prompt_of(t, i), params) for t, i in jobs)
        )

    return asyncio.run(all_of_them())


def mtmd_reference(files: tuple[Path, Path], text: str, images: Sequence[Image]) -> Any:
    """Next-token logits of the rendered prompt `text` as llama.cpp's own multimodal helper
    evaluates it (mtmd_tokenize + mtmd_helper_eval_chunks) on a fresh context, and the
    number of positions it used."""
    import llama_cpp.mtmd_cpp as mtmd

    model_path, mmproj = files
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 2048, 512, 512
    cparams.n_threads = cparams.n_threads_batch = 2
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    params = mtmd.mtmd_context_params_default()
    params.n_threads = 2
    params.print_timings = False
    params.media_marker = MEDIA_MARKER.encode()
    ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), model, params)
    assert ctx and mtmd.mtmd_decode_use_mrope(ctx)
    chunks = mtmd.mtmd_input_chunks_init()
    bitmaps = []
    try:
        for image in images:
            buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
            bitmaps.append(mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(image.data), False))
        raw = text.encode()
        inp = mtmd.mtmd_input_text(raw, len(raw), False, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), arr, len(bitmaps)) == 0
        n_past = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 512, True, ctypes.byref(n_past))
        assert rc == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = llama_cpp.llama_get_logits_ith(lctx, -1)
        return np.ctypeslib.as_array(logits, shape=(n_vocab,)).copy(), n_past.value
    finally:
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(ctx)
        llama_cpp.llama_free(lctx)
        llama_cpp.llama_model_free(model)


# -- the engine in-process ---------------------------------------------------------------


def test_the_family_loads_and_counts_grid_tokens(engine: LlamaCppEngine) -> None:
    assert engine.vision and engine._projector is not None and engine._projector.mrope
    text_only = prompt_of(engine, "Look")
    for image, (w, h) in ((RED, (64, 48)), (WIDE, (96, 32))):
        tokens = prompt_of(engine, "Look", [image])
        (chunk,) = engine._projector.image(image).chunks
        cols, rows = w // TOKEN_SIDE, h // TOKEN_SIDE
        assert (chunk.n_tokens, chunk.n_pos) == (cols * rows, max(cols, rows))
        placeholders = [t for t in tokens if t < 0]
        assert placeholders == chunk.placeholders
        # The image, its <|vision_start|>/<|vision_end|> text and the line break before it.
        assert len(tokens) > len(text_only) + chunk.n_tokens


def test_logits_agree_with_llama_cpps_own_multimodal_evaluation(
    engine: LlamaCppEngine, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's next-token logits after a prompt with two images (text before, between
    and after them) equal llama.cpp's mtmd helper evaluating the same prompt alone, and the
    sequence ends at the same position: wrong positions after an image would move them."""
    rows = capture_first_logits(engine, monkeypatch)
    images = [RED, WIDE]
    text = engine.render_prompt([ChatMessage("user", ["Compare", RED, "and", WIDE, "please."])])
    tokens = engine.tokenize(text, images)
    n_images = sum(c.n_tokens for im in images for c in engine._projector.image(im).chunks)  # type: ignore[union-attr]
    n_pos = sum(c.n_pos for im in images for c in engine._projector.image(im).chunks)  # type: ignore[union-attr]
    (out,) = run(engine, [(tokens, images)], SamplingParams(temperature=0, max_tokens=1))
    assert out.finished.prompt_tokens == len(tokens)
    reference, ref_positions = mtmd_reference(files, text, images)
    assert ref_positions == len(tokens) - n_images + n_pos
    np.testing.assert_allclose(rows[-1], reference, atol=2e-3, rtol=0)
    assert int(np.argmax(rows[-1])) == int(np.argmax(reference)) == out.tokens[0]


def test_the_sequence_holds_grid_positions(engine: LlamaCppEngine) -> None:
    tokens = prompt_of(engine, "Where", [WIDE], after=" now?")
    (chunk,) = engine._projector.image(WIDE).chunks  # type: ignore[union-attr]
    seen: list[int] = []
    real = engine._worker._finish

    def finish(job: Any, reason: Any, **kw: Any) -> None:
        if job.slot is not None:
            seen.append(llama_cpp.llama_memory_seq_pos_max(engine._mem, job.slot.seq_id))
        real(job, reason, **kw)

    engine._worker._finish = finish  # type: ignore[method-assign]
    try:
        (out,) = run(engine, [(tokens, [WIDE])], SamplingParams(temperature=0, max_tokens=4))
    finally:
        del engine._worker._finish
    # Prompt and output, less what the grid saves, minus the last sample (never decoded).
    decoded = len(tokens) + out.finished.completion_tokens - 1
    assert seen == [decoded - 1 - (chunk.n_tokens - chunk.n_pos)]


def test_identical_requests_reuse_the_image_and_answer_alike(engine: LlamaCppEngine) -> None:
    tokens = prompt_of(engine, "Describe", [BLUE])
    (first,) = run(engine, [(tokens, [BLUE])])
    (second,) = run(engine, [(tokens, [BLUE])])
    assert second.finished.cached_tokens == len(tokens) - 1
    assert second.tokens == first.tokens


def test_a_follow_up_turn_reuses_the_image_and_matches_a_fresh_prefill(
    engine: LlamaCppEngine, files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second turn after an image continues the first turn's cache (image included) and
    decodes its new text at positions after the grid: its logits equal mtmd's evaluation of
    the whole conversation from scratch."""
    turn1 = [ChatMessage("user", ["What is this?", RED])]
    text1 = engine.render_prompt(turn1)
    (answer,) = run(engine, [(engine.tokenize(text1, [RED]), [RED])])
    turn2 = [
        *turn1,
        ChatMessage("assistant", answer.text),
        ChatMessage("user", "And its colour?"),
    ]
    text2 = engine.render_prompt(turn2)
    tokens2 = engine.tokenize(text2, [RED])
    rows = capture_first_logits(engine, monkeypatch)
    (follow,) = run(engine, [(tokens2, [RED])], SamplingParams(temperature=0, max_tokens=1))
    assert follow.finished.cached_tokens >= len(engine.tokenize(text1, [RED])) - 1
    reference, _ = mtmd_reference(files, text2, [RED])
    np.testing.assert_allclose(rows[-1], reference, atol=2e-3, rtol=0)


def test_images_change_the_output(engine: LlamaCppEngine) -> None:
    red, blue = run(
        engine,
        [
            (prompt_of(engine, "Colour?", [RED]), [RED]),
            (prompt_of(engine, "Colour?", [BLUE]), [BLUE]),
        ],
    )
    assert red.tokens != blue.tokens


def test_concurrent_image_and_text_requests_do_not_interfere(engine: LlamaCppEngine) -> None:
    jobs: list[tuple[list[int], Sequence[Image]]] = [
        (prompt_of(engine, "Describe", [RED]), [RED]),
        (prompt_of(engine, "Say hello."), []),
        (prompt_of(engine, "Which one", [WIDE], after=" is wider?"), [WIDE]),
    ]
    solo = [run(engine, [job])[0] for job in jobs]
    # Fill the slots with other prompts first, so the concurrent run starts cold.
    run(engine, [(prompt_of(engine, f"Other {i}"), []) for i in range(3)])
    together = run(engine, jobs)
    for alone, mixed in zip(solo, together, strict=True):
        assert mixed.finished.cached_tokens < len(jobs[0][0]) // 2
        # Greedy ties may flip with batch shape; a long common start shows no interference.
        n = 0
        while n < min(len(alone.tokens), len(mixed.tokens)) and alone.tokens[n] == mixed.tokens[n]:
            n += 1
        assert n >= 6, (alone.text, mixed.text)


# -- through the server and the openai SDK -------------------------------------------------


def data_uri(image: Image) -> str:
    return "data:image/png;base64," + base64.b64encode(image.data).decode()


@pytest.fixture(scope="module")
def server(
    files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RespdServer]:
    model, mmproj = files
    srv = start_server(
        tmp_path_factory.mktemp("respd-qwen2vl"),
        "--model", str(model), "--model-alias", MODEL, "--mmproj", str(mmproj),
        "--parallel", "2", "--store", "memory",
        preset="small",
    )  # fmt: skip
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture(scope="module")
def client(server: RespdServer) -> openai.OpenAI:
    return server.client()


def test_sdk_responses_and_chat_take_the_image(
    client: openai.OpenAI, engine: LlamaCppEngine
) -> None:
    expected = len(prompt_of(engine, "What is this?", [RED]))
    response = client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": data_uri(RED), "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=8,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": data_uri(RED)}},
                ],
            }
        ],
        max_tokens=8,
        temperature=0,
    )
    assert response.usage and chat.usage
    assert response.usage.input_tokens == chat.usage.prompt_tokens == expected
    assert response.output_text == chat.choices[0].message.content
    assert response.status in ("completed", "incomplete")


def test_sdk_screenshot_tool_output_flow(client: openai.OpenAI) -> None:
    """The seed's flow: an agent's tool returns a screenshot; the model reads it and answers
    (another screenshot, another answer), and the next
    turn (same tools, so the same system prompt) chains from the stored response with the
    image's cache reused."""

    ASK = "Take a screenshot and tell me its dominant color."

    def screenshot(image: Image) -> list[Any]:
        return [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": "captured"},
                        {"type": "input_image", "image_url": data_uri(image)}]},
        ]  # fmt: skip

    tools: Any = [
        {
            "type": "function",
            "name": "screenshot",
            "parameters": {"type": "object", "properties": {}},
        }
    ]
    first = client.responses.create(
        model=MODEL, input=screenshot(WIDE), tools=tools,
        max_output_tokens=8, temperature=0, store=True,
    )  # fmt: skip
    follow = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="Anything else?", tools=tools,
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    other = client.responses.create(
        model=MODEL, input=screenshot(RED), tools=tools,
        max_output_tokens=8, temperature=0,
    )  # fmt: skip
    assert first.status in ("completed", "incomplete") and first.usage and other.usage
    assert [item.type for item in first.output] == ["message"]
    assert first.output_text != other.output_text
    assert follow.usage and follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1


# -- detail ------------------------------------------------------------------------------

LARGE = png_bytes((90, 90, 200), size=(768, 384))


def test_low_detail_shrinks_the_image_to_fewer_tokens(engine: LlamaCppEngine) -> None:
    """`high`/`auto`/`original` keep the image's resolution (within the projector's limits);
    `low` first fits it in 512x512, as OpenAI's low detail does: here 48x24 tokens become
    32x16."""
    counts = {}
    for detail in ("auto", "high", "original", "low"):
        image = Image(LARGE, "image/png", detail)
        (chunk,) = engine._projector.image(image).chunks  # type: ignore[union-attr]
        counts[detail] = (chunk.n_tokens, chunk.n_pos)
    side = TOKEN_SIDE
    assert (
        counts["auto"]
        == counts["high"]
        == counts["original"]
        == (
            (768 // side) * (384 // side),
            768 // side,
        )
    )
    assert counts["low"] == ((512 // side) * (256 // side), 512 // side)
    # The two are different images to the cache: a low-detail request reuses nothing of
    # the full one past the text before it.
    full, low = Image(LARGE, "image/png"), Image(LARGE, "image/png", "low")
    tokens_full, tokens_low = prompt_of(engine, "See", [full]), prompt_of(engine, "See", [low])
    assert not {t for t in tokens_full if t < 0} & {t for t in tokens_low if t < 0}
    (out,) = run(engine, [(tokens_low, [low])], SamplingParams(temperature=0, max_tokens=2))
    assert (
        out.finished.prompt_tokens
        == len(tokens_low)
        == len(tokens_full) - (counts["auto"][0] - counts["low"][0])
    )


def test_sdk_low_detail_costs_fewer_input_tokens(client: openai.OpenAI) -> None:
    def usage(detail: Any) -> int:
        r = client.responses.create(
            model=MODEL,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,"
                            + base64.b64encode(LARGE).decode(),
                            "detail": detail,
                        },
                    ],
                }
            ],
            max_output_tokens=2,
        )
        assert r.usage
        return r.usage.input_tokens

    high, low = usage("high"), usage("low")
    assert high - low == (768 // TOKEN_SIDE) * (384 // TOKEN_SIDE) - (512 // TOKEN_SIDE) * (
        256 // TOKEN_SIDE
    )
