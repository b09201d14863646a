"""Images on a model that cannot see them (`--image-input-fallback placeholder`), and images
replayed by `previous_response_id` chains (the media cache, the projector's counters): real
`respd serve` processes driven by the `openai` SDK, counters read from `/health` and
`/metrics`."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image as PILImage
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gguf.llava import png_bytes, write_projector
from tests.support.servers import MODEL_ID, RespdServer, start_server


def png(color: str = "red", size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


SCREENSHOT = data_url(png())
SEEN = "[image: 64x48 image/png omitted; this model cannot see images]"


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def screenshot_turn(*output: dict[str, Any]) -> list[dict[str, Any]]:
    """An agent's turn: it asked for a screenshot, the tool answered with `output`."""
    return [
        {"type": "message", "role": "user", "content": [text("What is on my screen?")]},
        {"type": "function_call", "call_id": "call_s", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_s", "output": list(output)},
    ]


def health(server: RespdServer) -> dict[str, Any]:
    reply = httpx.get(server.base_url + "/health", timeout=10)
    assert reply.status_code == 200
    body: dict[str, Any] = reply.json()
    return body


def metrics(server: RespdServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    scraped = httpx.get(server.base_url + "/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
    }


# -- a text-only model with the placeholder fallback ------------------------------------------


@pytest.fixture(scope="module")
def placeholder_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-placeholder"),
        "--store",
        "memory",
        "--image-input-fallback",
        "placeholder",
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture()
def pclient(placeholder_server: RespdServer) -> openai.OpenAI:
    return placeholder_server.client()


def test_a_screenshot_tool_result_is_answered_with_a_placeholder(pclient: openai.OpenAI) -> None:
    items = screenshot_turn(text("captured"), {"type": "input_image", "image_url": SCREENSHOT})
    resp = pclient.responses.create(
        model=MODEL_ID,
        input=items,  # type: ignore[arg-type]
        max_output_tokens=8,
        temperature=0,
    )
    assert resp.status in ("completed", "incomplete") and resp.output
    # What the model read: exactly the tool text with the placeholder line in the image's place.
    as_text = screenshot_turn(text("captured"), text(SEEN))
    counted = [
        pclient.responses.input_tokens.count(model=MODEL_ID, input=body).input_tokens  # type: ignore[arg-type]
        for body in (items, as_text)
    ]
    assert counted[0] == counted[1] == resp.usage.input_tokens  # type: ignore[union-attr]


def test_chat_image_url_is_answered_with_a_placeholder(pclient: openai.OpenAI) -> None:
    reply = pclient.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What colour is this?"},
                    {"type": "image_url", "image_url": {"url": SCREENSHOT, "detail": "low"}},
                ],
            }
        ],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    plain = pclient.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": f"What colour is this?\n{SEEN}"}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.usage is not None and plain.usage is not None
    assert reply.usage.prompt_tokens == plain.usage.prompt_tokens


def test_broken_images_are_still_400s(pclient: openai.OpenAI) -> None:
    broken = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    with pytest.raises(openai.BadRequestError) as exc:
        pclient.responses.create(model=MODEL_ID, input=screenshot_turn(broken))  # type: ignore[arg-type]
    assert (exc.value.code, exc.value.param) == ("invalid_image", "input[2].output[0].image_url")


def test_replayed_screenshots_come_from_the_media_cache(
    placeholder_server: RespdServer, pclient: openai.OpenAI
) -> None:
    shot = data_url(png("teal", (33, 21)))
    before = health(placeholder_server)["media_cache"]
    resp = pclient.responses.create(
        model=MODEL_ID,
        input=screenshot_turn({"type": "input_image", "image_url": shot}),  # type: ignore[arg-type]
        max_output_tokens=4,
    )
    for question in ("And now?", "Anything else?"):
        resp = pclient.responses.create(
            model=MODEL_ID, input=question, previous_response_id=resp.id, max_output_tokens=4
        )
    after = health(placeholder_server)["media_cache"]
    assert after["misses"] - before["misses"] == 1
    assert after["hits"] - before["hits"] == 2
    assert after["bytes"] >= len(png("teal", (33, 21)))


# -- a vision model: an image replayed over three turns ---------------------------------------


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("respd-vision-reuse")
    mmproj: Path = write_projector(tmp / "mmproj-test.gguf")
    srv = start_server(
        tmp,
        "--mmproj",
        str(mmproj),
        "--parallel",
        "2",
        "--store",
        "memory",
        preset="compact",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


def test_an_image_is_tokenized_and_encoded_once_over_a_three_turn_chain(
    vision_server: RespdServer,
) -> None:
    client = vision_server.client()
    start = health(vision_server)
    assert start["engine"]["images_tokenized"] == 0
    assert start["engine"]["image_chunks_encoded"] == 0
    picture = {"type": "input_image", "image_url": data_url(png_bytes((200, 30, 120)))}
    first: list[Any] = [{"role": "user", "content": [text("What is in this picture?"), picture]}]
    resp = client.responses.create(
        model=MODEL_ID,
        input=first,
        max_output_tokens=6,
        temperature=0,
    )
    assert resp.status in ("completed", "incomplete")
    for question in ("Tell me more.", "And its colour?"):
        resp = client.responses.create(
            model=MODEL_ID,
            input=question,
            previous_response_id=resp.id,
            max_output_tokens=6,
            temperature=0,
        )
        assert resp.status in ("completed", "incomplete")

    end = health(vision_server)
    assert end["engine"]["images_tokenized"] == 1
    assert end["engine"]["image_chunks_encoded"] == 1
    assert (end["media_cache"]["misses"], end["media_cache"]["hits"]) == (1, 2)
    scraped = metrics(vision_server)
    model = frozenset({("model", MODEL_ID)})
    assert scraped[("respd_images_tokenized_total", model)] == 1
    assert scraped[("respd_image_chunks_encoded_total", model)] == 1
    assert scraped[("respd_media_cache_hits_total", frozenset())] == 2
    assert scraped[("respd_media_cache_misses_total", frozenset())] == 1
    assert scraped[("respd_media_cache_bytes", frozenset())] > 0
