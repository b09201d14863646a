"""Image encoding off the decode thread: `image_encode="background"` against `"inline"`.

Real llama.cpp and mtmd throughout (SmolLM2 and the tiny projector of
`tests/support/gguf/llava.py`).
Its encodes take milliseconds, so where a test needs a slow (or failing) one it wraps the
projector's `embeddings`, where the vision encoder runs, on the instance: those images sleep
first, then encode for real (or fail). The sleep needs no CPU, so what the other sequences
do meanwhile shows whether the worker waited on the encode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, GenerationDone, Image, SamplingParams, TokenChunk
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.llamacpp.multimodal import ImageChunk, Projector
from tests.support.engine import Output, collect
from tests.support.gguf.llava import png_bytes, write_projector
from tests.support.servers import MODEL_ID

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def fresh_image(n: int) -> Image:
    """An image no earlier test encoded (the projector keeps embeddings by image)."""
    return Image(png_bytes((11 * n % 256, 7 * n % 256, 255 - n % 256)), "image/png")


@pytest.fixture(scope="session")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-test.gguf")


def make_engine(mmproj: Path, mode: Literal["background", "inline"]) -> LlamaCppEngine:
    return LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=2048,
        n_threads=2,
        parallel=3,
        mmproj=mmproj,
        image_encode=mode,
    )


@pytest.fixture(scope="module")
def background(mmproj: Path) -> Iterator[LlamaCppEngine]:
    eng = make_engine(mmproj, "background")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def inline(mmproj: Path) -> Iterator[LlamaCppEngine]:
    eng = make_engine(mmproj, "inline")
    yield eng
    eng.close()


def projector(engine: LlamaCppEngine) -> Projector:
    assert engine._projector is not None
    return engine._projector


def image_prompt(engine: LlamaCppEngine, images: Sequence[Image], text: str) -> Any:
    rendered = engine.render_prompt([ChatMessage("user", [text, *images])])
    return engine.prompt_of(engine.tokenize(rendered, images), images)


def text_prompt(engine: LlamaCppEngine, text: str) -> Any:
    return engine.prompt_of(engine.tokenize(engine.render_prompt([ChatMessage("user", text)])))


def settle(engine: LlamaCppEngine) -> None:
    """Wait for the engine to end what closed streams left running (it does at its next step)."""
    deadline = time.monotonic() + 10
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.stats().running == 0


class SlowEncode:
    """Stands in for `Projector.embeddings`: the chunks of `images` sleep `delay` seconds,
    then encode for real (or, with `fail`, raise); other chunks encode as usual."""

    def __init__(
        self, proj: Projector, images: Sequence[Image], delay: float, *, fail: bool = False
    ) -> None:
        self.chunks = [chunk for image in images for chunk in proj.image(image).chunks]
        self.real = proj.embeddings
        self.delay = delay
        self.fail = fail
        self.started = threading.Event()
        self.threads: list[str] = []  # where each slow encode ran
        self.spans: list[tuple[float, float]] = []  # (start, end) of each sleep

    def __call__(self, chunk: ImageChunk) -> Any:
        if chunk in self.chunks:
            self.threads.append(threading.current_thread().name)
            start = time.monotonic()
            self.started.set()
            time.sleep(self.delay)
            self.spans.append((start, time.monotonic()))
            if self.fail:
                raise RuntimeError("image encoding failed: injected")
        return self.real(chunk)


def test_background_encoding_answers_as_inline(
    background: LlamaCppEngine, inline: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = [fresh_image(1), fresh_image(2), fresh_image(3)]
    watch = SlowEncode(projector(background), images, 0.0)
    monkeypatch.setattr(projector(background), "embeddings", watch)
    cases = [([images[0]], "What is in this picture?"), ([images[1], images[2]], "Compare them.")]
    for imgs, text in cases:
        answers = [
            asyncio.run(collect(engine, image_prompt(engine, imgs, text), GREEDY))
            for engine in (background, inline)
        ]
        assert answers[0].finished.finish_reason in ("stop", "length") and answers[0].tokens
        assert answers[0].tokens == answers[1].tokens, text
    # Every image was encoded once, off the decode worker.
    assert len(watch.threads) == 3 and all(t.startswith("mtmd-encode") for t in watch.threads)


async def _stream_text_while_an_image_encodes(
    engine: LlamaCppEngine, image: Image
) -> tuple[list[float], Output]:
    """Stream a long text answer; after its first tokens, send a request with `image` too.
    Returns the text's token arrival times and the image request's output."""
    params = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)
    text = engine.generate(text_prompt(engine, "Tell me a long story."), params)
    stamps: list[float] = []
    image_job: asyncio.Task[Output] | None = None
    async for event in text:
        if isinstance(event, GenerationDone):
            break
        if isinstance(event, TokenChunk):
            stamps.append(time.monotonic())
        if image_job is None and len(stamps) >= 3:
            prompt = image_prompt(engine, [image], "Describe it.")
            image_job = asyncio.create_task(collect(engine, prompt, GREEDY))
        elif image_job is not None and image_job.done():
            break
    await text.aclose()
    assert image_job is not None
    return stamps, await image_job


@pytest.mark.parametrize("mode", ["background", "inline"])
def test_text_keeps_streaming_while_an_image_encodes(
    mode: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine: LlamaCppEngine = request.getfixturevalue(mode)
    image = fresh_image(10 if mode == "background" else 11)
    slow = SlowEncode(projector(engine), [image], 1.5)
    monkeypatch.setattr(projector(engine), "embeddings", slow)
    stamps, out = asyncio.run(_stream_text_while_an_image_encodes(engine, image))
    assert out.finished.finish_reason in ("stop", "length")
    [(start, end)] = slow.spans
    # A margin for the tokens of the step before the encode, read a little late.
    during = [t for t in stamps if start + 0.2 < t < end]
    if mode == "background":
        assert len(during) >= 10, (len(during), len(stamps))
    else:  # the worker itself sleeps in the encode: every sequence stands still
        assert during == []
    settle(engine)


def test_cancelling_a_request_whose_image_is_encoding(
    background: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = fresh_image(20)
    slow = SlowEncode(projector(background), [image], 2.0)
    monkeypatch.setattr(projector(background), "embeddings", slow)
    before = background.stats()

    async def cancel_while_encoding() -> tuple[GenerationDone | None, float]:
        stream = background.generate(image_prompt(background, [image], "Describe it."), GREEDY)
        while not slow.started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the worker is waiting on the encode by now
        cancelled_at = time.monotonic()
        stream.cancel()
        async for event in stream:
            if isinstance(event, GenerationDone):
                return event, time.monotonic() - cancelled_at
        return None, 0.0

    done, took = asyncio.run(cancel_while_encoding())
    assert done is not None and done.finish_reason == "cancelled"
    assert took < 0.5 and not slow.spans  # over well before the encode
    after = background.stats()
    assert after.running == 0 and after.cancelled == before.cancelled + 1
    # The engine keeps serving, encode or not.
    text = asyncio.run(collect(background, text_prompt(background, "Say hi."), GREEDY))
    assert text.finished.finish_reason in ("stop", "length")
    # The encode ran to its end and stays cached: the image is not encoded again.
    deadline = time.monotonic() + 10
    while not slow.spans and time.monotonic() < deadline:
        time.sleep(0.05)
    again = asyncio.run(collect(background, image_prompt(background, [image], "Hm?"), GREEDY))
    assert again.finished.finish_reason in ("stop", "length")
    assert len(slow.threads) == 1


def test_a_failing_encode_fails_its_request_only(
    background: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed, fine = fresh_image(30), fresh_image(31)
    proj = projector(background)
    failing = SlowEncode(proj, [doomed], 0.5, fail=True)
    monkeypatch.setattr(proj, "embeddings", failing)

    async def together() -> list[Output]:
        return await asyncio.gather(
            collect(background, image_prompt(background, [doomed], "Describe it."), GREEDY),
            collect(background, text_prompt(background, "Say hello."), GREEDY),
            collect(background, image_prompt(background, [fine], "Describe it."), GREEDY),
        )

    failed, hello, seen = asyncio.run(together())
    assert failed.finished.finish_reason == "error"
    assert failed.finished.error and "injected" in failed.finished.error
    assert hello.finished.finish_reason in ("stop", "length") and hello.text
    assert seen.finished.finish_reason in ("stop", "length")
    assert failing.threads and failing.threads[0].startswith("mtmd-encode")
    # A failure is not kept: the same image encodes again on the next request.
    monkeypatch.setattr(proj, "embeddings", failing.real)
    again = asyncio.run(collect(background, image_prompt(background, [doomed], "Hm?"), GREEDY))
    assert again.finished.finish_reason in ("stop", "length")
    assert background.stats().running == 0


def test_closing_the_engine_while_images_encode(
    mmproj: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running encode is waited for, the queued one cancelled: close does not hang."""
    engine = make_engine(mmproj, "background")
    first, second = fresh_image(40), fresh_image(41)
    slow = SlowEncode(projector(engine), [first, second], 1.5)
    monkeypatch.setattr(projector(engine), "embeddings", slow)

    async def close_while_encoding() -> float:
        streams = [
            engine.generate(image_prompt(engine, [image], "Describe it."), GREEDY)
            for image in (first, second)
        ]
        while not slow.started.is_set() or engine.stats().running < 2:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.to_thread(engine.close)
        del streams
        return time.monotonic() - started

    took = asyncio.run(close_while_encoding())
    assert took < 2.5, took
    assert len(slow.threads) == 1  # the second image never started encoding
