"""Image input through llama.cpp's mtmd with a real projector GGUF the tests write themselves
(`tests/support/gguf/llava.py`: a tiny random-weight CLIP tower + `mlp` projector into SmolLM2's
embedding space, 16 image tokens per image).

The first part drives `LlamaCppEngine(..., mmproj=...)` in-process: real llama.cpp decoding,
real image encoding, real batching. The second part goes through `respd serve --mmproj` and
the `openai` SDK with `input_image` parts.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import openai
import pytest

from respd.config import embedded_model_path
from respd.engines.base import ChatMessage, GenerationDone, Image, SamplingParams, TokenChunk
from respd.engines.llamacpp import LlamaCppEngine
from respd.engines.llamacpp.slots import common_prefix
from respd.engines.prompting import MEDIA_MARKER
from tests.support.gguf.llava import IMAGE_TOKENS, png_bytes, write_projector
from tests.support.servers import MODEL_ID, RespdServer, free_port, start_server

RED = Image(png_bytes((200, 20, 20)), "image/png")
BLUE = Image(png_bytes((20, 20, 220)), "image/png")
GREEN = Image(png_bytes((20, 210, 40), size=(70, 50)), "image/png")
QUESTION = "What is in this picture?"


@pytest.fixture(scope="session")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-test.gguf")


@pytest.fixture(scope="module")
def engine(mmproj: Path) -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        embedded_model_path(),
        model_id=MODEL_ID,
        n_ctx=1024,
        n_threads=2,
        parallel=3,
        mmproj=mmproj,
    )
    yield eng
    eng.close()


def image_prompt(engine: LlamaCppEngine, image: Image, text: str = QUESTION) -> list[int]:
    """The SmolLM2 chat prompt of one user turn: the text, then the image on its own line."""
    prompt = engine.render_prompt([ChatMessage("user", [text, image])])
    return engine.tokenize(prompt, [image])


def text_prompt(engine: LlamaCppEngine, text: str) -> list[int]:
    return engine.tokenize(engine.render_prompt([ChatMessage("user", text)]))


def generate(
    engine: LlamaCppEngine,
    jobs: Sequence[tuple[list[int], Sequence[Image]]],
    max_tokens: int = 16,
) -> list[tuple[str, GenerationDone]]:
    """Run `jobs` concurrently (greedy) and return each one's text and final event."""

    async def one(tokens: list[int], images: Sequence[Image]) -> tuple[str, GenerationDone]:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        stream = engine.generate(engine.prompt_of(tokens, images), params)
        text: list[str] = []
        async for event in stream:
            if isinstance(event, TokenChunk):
                text.append(event.text)
            elif isinstance(event, GenerationDone):
                return "".join(text), event
        raise AssertionError("stream ended without GenerationDone")

    async def all_of_them() -> list[tuple[str, GenerationDone]]:
        return await asyncio.gather(*(one(t, i) for t, i in jobs))

    return asyncio.run(all_of_them())


# -- the engine in-process ---------------------------------------------------------------


def test_an_image_takes_its_projector_token_count(engine: LlamaCppEngine) -> None:
    assert engine.vision and engine.prompter.marker == "<__media__>"
    with_image = engine.tokenize(engine.render_prompt([ChatMessage("user", [RED])]), [RED])
    # The marker sits between special tokens, so the text around it tokenizes as without it.
    text_only = engine.tokenize(engine.render_prompt([ChatMessage("user", "")]))
    assert len(with_image) == len(text_only) + IMAGE_TOKENS
    placeholders = [t for t in with_image if t < 0]
    assert len(placeholders) == IMAGE_TOKENS == len(set(placeholders))
    # Placeholders come from the image's content: equal images give equal ids (whatever
    # object carries them), other images other ids.
    again = Image(bytes(RED.data), "image/png")
    assert engine.tokenize(engine.render_prompt([ChatMessage("user", MEDIA_MARKER)]), [again]) == (
        with_image
    )
    other = engine.tokenize(engine.render_prompt([ChatMessage("user", MEDIA_MARKER)]), [BLUE])
    assert not set(placeholders) & {t for t in other if t < 0}
    # Every image, whatever its size, is resized to the projector's square.
    assert len(image_prompt(engine, GREEN)) == len(image_prompt(engine, RED))


def test_two_images_in_one_prompt(engine: LlamaCppEngine) -> None:
    prompt = engine.render_prompt([ChatMessage("user", ["Compare", RED, "with", BLUE])])
    tokens = engine.tokenize(prompt, [RED, BLUE])
    assert sum(1 for t in tokens if t < 0) == 2 * IMAGE_TOKENS
    [(_, done)] = generate(engine, [(tokens, [RED, BLUE])], max_tokens=4)
    assert done.finish_reason in ("stop", "length") and done.prompt_tokens == len(tokens)


def test_markers_and_images_must_agree(engine: LlamaCppEngine) -> None:
    prompt = engine.render_prompt([ChatMessage("user", f"{MEDIA_MARKER} and {MEDIA_MARKER}")])
    with pytest.raises(ValueError, match="2 image markers for 1 images"):
        engine.tokenize(prompt, [RED])
    with pytest.raises(ValueError, match="image markers"):
        engine.tokenize(engine.render_prompt([ChatMessage("user", "no marker")]), [RED])
    with pytest.raises(ValueError, match="image could not be decoded"):
        engine.tokenize(engine.render_prompt([ChatMessage("user", MEDIA_MARKER)]), [Image(b"no")])
    with pytest.raises(ValueError, match="must not end with an image"):
        engine.tokenize(f"Look: {MEDIA_MARKER}", [RED])
    # generate() checks the tokens against the images it is given.
    tokens = image_prompt(engine, RED)

    async def admit(images: Sequence[Image]) -> None:
        engine.generate(engine.prompt_of(tokens, images), SamplingParams(max_tokens=1))

    with pytest.raises(ValueError, match="do"):
        asyncio.run(admit([BLUE]))
    with pytest.raises(ValueError, match="no images were given"):
        asyncio.run(admit([]))


def test_identical_requests_answer_alike_and_reuse_the_image(engine: LlamaCppEngine) -> None:
    tokens = image_prompt(engine, RED)
    image_end = max(i for i, t in enumerate(tokens) if t < 0) + 1
    [(first, done1)] = generate(engine, [(tokens, [RED])])
    [(second, done2)] = generate(engine, [(tokens, [RED])])
    assert done1.finish_reason in ("stop", "length") and first
    assert second == first
    assert done1.prompt_tokens == done2.prompt_tokens == len(tokens)
    # The second request reuses the whole prompt but its last token, image included.
    assert done2.cached_tokens == len(tokens) - 1 >= image_end


def test_another_image_is_never_reused_from_the_cache(engine: LlamaCppEngine) -> None:
    red = image_prompt(engine, RED)
    blue = image_prompt(engine, BLUE)
    image_start = next(i for i, t in enumerate(blue) if t < 0)
    assert red[:image_start] == blue[:image_start]
    generate(engine, [(red, [RED])], max_tokens=2)
    [(_, done)] = generate(engine, [(blue, [BLUE])], max_tokens=2)
    # The text before the image comes from the cache; nothing of the red image does.
    assert done.cached_tokens == image_start


def test_images_reach_the_model(engine: LlamaCppEngine) -> None:
    """Different pictures behind the same text change what the model says (the projector's
    random embeddings move the greedy answer)."""
    answers = {
        text
        for image in (RED, BLUE, GREEN)
        for text, _ in generate(engine, [(image_prompt(engine, image), [image])], max_tokens=12)
    }
    assert len(answers) > 1, answers


def test_concurrent_image_and_text_requests_do_not_interfere(engine: LlamaCppEngine) -> None:
    jobs: list[tuple[list[int], Sequence[Image]]] = [
        (image_prompt(engine, RED, "Describe the image."), [RED]),
        (text_prompt(engine, "What is the capital of France?"), []),
        (image_prompt(engine, BLUE, "Name a colour you see."), [BLUE]),
    ]
    solo = [generate(engine, [job], max_tokens=20)[0][0] for job in jobs]
    # Three other prompts at once take every slot, so no slot keeps the prompts above: the
    # concurrent run decodes its images again, between the steps of the other sequences.
    fillers = [text_prompt(engine, f"Count to {n}.") for n in (3, 4, 5)]
    generate(engine, [(f, []) for f in fillers], max_tokens=2)
    together = generate(engine, jobs, max_tokens=20)
    for i, (text, done) in enumerate(together):
        assert done.finish_reason in ("stop", "length")
        if jobs[i][1]:
            image_start = next(p for p, t in enumerate(jobs[i][0]) if t < 0)
            assert done.cached_tokens <= image_start
        own = common_prefix(text, solo[i])
        assert own >= min(len(solo[i]), 12), (i, text, solo[i])
        for j, other in enumerate(solo):
            if j != i and other != solo[i]:
                assert common_prefix(text, other) < own or own == len(text), (i, j)
    assert engine.stats().running == 0 and engine.stats().queued == 0


def test_a_failing_image_fails_its_request_only(
    engine: LlamaCppEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    projector = engine._projector
    assert projector is not None
    real = projector.embeddings
    doomed = Image(png_bytes((1, 2, 3)), "image/png")
    doomed_chunks = projector.image(doomed).chunks

    def embeddings(chunk: object) -> object:
        if chunk in doomed_chunks:
            raise RuntimeError("image encoding failed: injected")
        return real(chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(projector, "embeddings", embeddings)
    fine = Image(png_bytes((9, 99, 199)), "image/png")
    results = generate(
        engine,
        [
            (image_prompt(engine, doomed), [doomed]),
            (text_prompt(engine, "Say hello."), []),
            (image_prompt(engine, fine), [fine]),
        ],
        max_tokens=6,
    )
    (_, failed), (hello, ok_text), (_, ok_image) = results
    assert failed.finish_reason == "error" and failed.error and "injected" in failed.error
    assert ok_text.finish_reason in ("stop", "length") and hello
    assert ok_image.finish_reason in ("stop", "length")
    # The worker carries on, and the doomed slot's cache is gone, not half-filled.
    monkeypatch.setattr(projector, "embeddings", real)
    [(_, again)] = generate(engine, [(image_prompt(engine, doomed), [doomed])], max_tokens=2)
    assert again.finish_reason in ("stop", "length")
    assert engine.stats().running == 0


def test_closing_an_image_request_cancels_it(engine: LlamaCppEngine) -> None:
    image = Image(png_bytes((77, 7, 177)), "image/png")
    tokens = image_prompt(engine, image, "Write a very long story about it.")
    before = engine.stats()

    async def start_and_leave() -> None:
        stream = engine.generate(engine.prompt_of(tokens, [image]), SamplingParams(max_tokens=500))
        async for event in stream:
            if isinstance(event, TokenChunk):
                break  # generating: the image is in the cache by now
        await stream.aclose()

    asyncio.run(start_and_leave())
    deadline = time.monotonic() + 30
    while engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.05)
    after = engine.stats()
    assert after.running == 0 and after.cancelled == before.cancelled + 1
    assert after.generated_tokens - before.generated_tokens < 100


def test_a_text_only_engine_refuses_images() -> None:
    eng = LlamaCppEngine(embedded_model_path(), model_id=MODEL_ID, n_ctx=256, parallel=1)
    try:
        assert not eng.vision
        with pytest.raises(ValueError, match="no image input"):
            eng.tokenize(f"{MEDIA_MARKER}\nhi", [RED])
        # Without images the marker is plain text.
        assert all(t >= 0 for t in eng.tokenize(f"{MEDIA_MARKER}\nhi"))
    finally:
        eng.close()


# -- start-up errors -----------------------------------------------------------------------


def _serve_fails(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "respd", "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    return out


def test_a_projector_for_another_model_is_a_clear_startup_error(tmp_path: Path) -> None:
    wrong = write_projector(tmp_path / "mmproj-512.gguf", proj_dim=512)
    out = _serve_fails("--mmproj", str(wrong))
    assert "cannot use the projector" in out and "n_embd = 576" in out, out
    out = _serve_fails("--mmproj", str(tmp_path / "missing.gguf"))
    assert "projector file not found" in out, out
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF not really")
    assert "cannot use the projector" in _serve_fails("--mmproj", str(garbage))


# -- through the server and the openai SDK -------------------------------------------------


def data_uri(image: Image) -> str:
    return "data:image/png;base64," + base64.b64encode(image.data).decode()


def image_input(image: Image, text: str = QUESTION) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": data_uri(image), "detail": "auto"},
            ],
        }
    ]


@pytest.fixture(scope="module")
def vision_server(mmproj: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-vision"),
        "--mmproj",
        str(mmproj),
        "--parallel",
        "3",
        "--store",
        "memory",
        preset="compact",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_models_list_image_input(vision_server: RespdServer) -> None:
    card = httpx.get(vision_server.base_url + "/v1/models", timeout=10).json()["data"][0]
    assert card["input_modalities"] == ["text", "image"]


@pytest.fixture(scope="module")
def vclient(vision_server: RespdServer) -> openai.OpenAI:
    return vision_server.client()


def test_sdk_image_request_counts_the_image(vclient: openai.OpenAI, engine: LlamaCppEngine) -> None:
    with_image = vclient.responses.create(
        model=MODEL_ID,
        input=[
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": data_uri(RED), "detail": "auto"}],
            }
        ],
        max_output_tokens=8,
        temperature=0,
    )
    # The same turn holding one text token instead ("x"; an empty turn is refused).
    assert len(engine.tokenize("x")) == 1
    one_token = vclient.responses.create(
        model=MODEL_ID, input=[{"role": "user", "content": "x"}], max_output_tokens=8
    )
    assert with_image.status in ("completed", "incomplete")
    assert with_image.usage and one_token.usage
    assert with_image.usage.input_tokens == one_token.usage.input_tokens - 1 + IMAGE_TOKENS


def test_sdk_identical_image_requests_reuse_the_cache(vclient: openai.OpenAI) -> None:
    kwargs: dict[str, object] = {
        "model": MODEL_ID,
        "input": image_input(BLUE, "Describe it in one sentence."),
        "max_output_tokens": 16,
        "temperature": 0,
    }
    first = vclient.responses.create(**kwargs)  # type: ignore[call-overload]
    second = vclient.responses.create(**kwargs)  # type: ignore[call-overload]
    assert first.status == "completed" or first.status == "incomplete"
    assert second.output_text == first.output_text
    assert first.usage and second.usage
    assert second.usage.input_tokens == first.usage.input_tokens
    # The whole prompt but its last token, so the image too.
    assert second.usage.input_tokens_details.cached_tokens == second.usage.input_tokens - 1


def test_sdk_another_image_is_not_reused(vclient: openai.OpenAI) -> None:
    text = "Which colour dominates?"
    vclient.responses.create(
        model=MODEL_ID, input=image_input(RED, text), max_output_tokens=2, temperature=0
    )
    other = vclient.responses.create(
        model=MODEL_ID, input=image_input(GREEN, text), max_output_tokens=2, temperature=0
    )
    assert other.usage
    cached = other.usage.input_tokens_details.cached_tokens
    # At most the text before the image is reused: the prompt minus the image and the text
    # after it (the closing tokens of the turn and the assistant header).
    assert cached <= other.usage.input_tokens - IMAGE_TOKENS - 3


def test_sdk_concurrent_image_and_text_requests(
    vclient: openai.OpenAI, vision_server: RespdServer
) -> None:
    inputs: list[object] = [
        image_input(RED, "Describe the image."),
        "What is the capital of France?",
        image_input(GREEN, "Name a colour you see."),
        "Say hello.",
    ]
    solo = [
        vclient.responses.create(
            model=MODEL_ID,
            input=inp,
            max_output_tokens=20,
            temperature=0,  # type: ignore[arg-type]
        ).output_text
        for inp in inputs
    ]

    async def all_of_them() -> list[str]:
        aclient = vision_server.async_client()
        try:
            results = await asyncio.gather(
                *(
                    aclient.responses.create(
                        model=MODEL_ID,
                        input=inp,  # type: ignore[arg-type]
                        max_output_tokens=20,
                        temperature=0,
                    )
                    for inp in inputs
                )
            )
        finally:
            await aclient.close()
        assert all(r.status in ("completed", "incomplete") for r in results)
        return [r.output_text for r in results]

    together = asyncio.run(all_of_them())
    for i, text in enumerate(together):
        own = common_prefix(text, solo[i])
        assert own >= min(len(solo[i]), 12), (i, text, solo[i])
    health = httpx.get(vision_server.base_url + "/health", timeout=10).json()
    assert health["engine"]["running"] == 0 and health["engine"]["queued"] == 0


def _screenshot_request(image: Image) -> dict[str, object]:
    """A tool whose output carries a screenshot (an agent looking at its screen)."""
    return {
        "model": MODEL_ID,
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Take a screenshot and tell me its colour."}
                ],
            },
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "captured"},
                    {"type": "input_image", "image_url": data_uri(image)},
                ],
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "screenshot",
                "parameters": {"type": "object", "properties": {}},
            }
        ],
        "tool_choice": "none",
        "max_output_tokens": 8,
        "temperature": 0,
    }


def test_sdk_tool_output_image_reaches_the_model_after_the_tool_text(
    vclient: openai.OpenAI,
) -> None:
    first = vclient.responses.create(**_screenshot_request(RED))  # type: ignore[call-overload]
    again = vclient.responses.create(**_screenshot_request(RED))  # type: ignore[call-overload]
    other = vclient.responses.create(**_screenshot_request(BLUE))  # type: ignore[call-overload]
    assert first.status in ("completed", "incomplete")
    assert first.usage and again.usage and other.usage
    n = first.usage.input_tokens
    assert again.usage.input_tokens == other.usage.input_tokens == n
    # The same screenshot: the whole prompt but its last token is reused, image included.
    assert again.usage.input_tokens_details.cached_tokens == n - 1
    # Another screenshot: reuse stops where the image starts, which is right at the end of
    # the prompt (the follow-up user turn after the tool text), not inside the tool output.
    cached = other.usage.input_tokens_details.cached_tokens
    after_image = n - cached - IMAGE_TOKENS
    assert 0 < after_image <= 8, (n, cached)


def test_sdk_input_image_answers_like_chat_image_url(vclient: openai.OpenAI) -> None:
    """A user message carrying input_image gives the same answer as the equivalent
    image_url Chat Completions request."""
    text = "What colour is this picture?"
    responses = vclient.responses.create(
        model=MODEL_ID,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": text},
                    {"type": "input_image", "image_url": data_uri(GREEN)},
                ],
            }
        ],
        max_output_tokens=12,
        temperature=0,
    )
    chat = vclient.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": data_uri(GREEN)}},
                ],
            }
        ],
        max_tokens=12,
        temperature=0,
    )
    assert responses.usage and chat.usage
    assert chat.usage.prompt_tokens == responses.usage.input_tokens
    assert chat.choices[0].message.content == responses.output_text
    assert responses.output_text


def test_sdk_file_id_image_is_the_uploaded_image(vclient: openai.OpenAI) -> None:
    """An `input_image` by `file_id` resolves through the Files API to the same image as its
    data URI: same prompt length, and the second request reuses the first's image cells."""
    uploaded = vclient.files.create(file=("blue.png", BLUE.data, "image/png"), purpose="vision")
    text = "Is this picture dark?"
    by_uri = vclient.responses.create(
        model=MODEL_ID, input=image_input(BLUE, text), max_output_tokens=6, temperature=0
    )
    by_file = vclient.responses.create(
        model=MODEL_ID,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": text},
                    {"type": "input_image", "file_id": uploaded.id, "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=6,
        temperature=0,
    )
    assert by_uri.usage and by_file.usage
    assert by_file.usage.input_tokens == by_uri.usage.input_tokens
    assert by_file.usage.input_tokens_details.cached_tokens == by_file.usage.input_tokens - 1
    assert by_file.output_text == by_uri.output_text
    vclient.files.delete(uploaded.id)
    with pytest.raises(openai.NotFoundError) as err:
        vclient.responses.create(
            model=MODEL_ID,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "file_id": uploaded.id}],
                }
            ],
            max_output_tokens=2,
        )
    assert err.value.body["param"] == "input[0].content[0].file_id"  # type: ignore[index]
