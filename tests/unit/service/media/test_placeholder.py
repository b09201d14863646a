"""`--image-input-fallback placeholder`: on a model without image input, each image part
becomes one line of text where it was (user turns, other roles, tool outputs, Chat's
`image_url`), after being resolved and checked as ever; through the app on the fake engine,
a screenshot in a tool result is then answered instead of refused."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any

import httpx
import openai
import pytest
from PIL import Image as PILImage

from respd.api.app import create_app
from respd.engines.base import ChatMessage, Image
from respd.engines.fake import FakeEngine, Reply
from respd.engines.messages import ATTACHED_LINE, images_on_user_turns
from respd.protocol.errors import APIError
from respd.service.chat.translate import chat_messages
from respd.service.media.lowering import Lowering, placeholder
from respd.service.media.parts import ImageFallback
from respd.service.media.resolver import MediaResolver, MediaSettings
from respd.service.responses.translate import input_to_messages
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL


def png(color: str = "red", size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


RED = "data:image/png;base64," + base64.b64encode(png()).decode()
SEEN = "[image: 64x48 image/png omitted; this model cannot see images]"


def low(media: Any, *, placeholders: bool = True) -> Lowering:
    return Lowering("m", False, media, image_placeholders=placeholders)


def translate(items: list[Any], *, placeholders: bool = True) -> list[ChatMessage]:
    media = asyncio.run(MediaResolver(MemoryStore()).resolve_items(items, "owner"))
    return input_to_messages(items, lowering=low(media, placeholders=placeholders))


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def image(url: str = RED, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, **extra}


def screenshot_items() -> list[dict[str, Any]]:
    return [
        user(text("Take a screenshot.")),
        {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [text("captured"), image()],
        },
    ]


def test_the_placeholder_names_size_and_type_where_known() -> None:
    assert placeholder(Image(b"", "image/jpeg")) == (
        "[image: image/jpeg omitted; this model cannot see images]"
    )
    assert placeholder(Image(b"")) == "[image omitted; this model cannot see images]"


def test_user_images_become_a_line_in_place() -> None:
    [msg] = translate([user(text("Before"), image(detail="low"), text("After"))])
    assert msg.text == f"Before\n{SEEN}\nAfter" and msg.images == []


def test_a_tool_output_image_becomes_tool_text_with_no_image_turn() -> None:
    messages = images_on_user_turns(translate(screenshot_items()))
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[2].text == f"captured\n{SEEN}"
    assert ATTACHED_LINE not in messages[2].text
    assert not any(m.images for m in messages)


def test_chat_image_url_parts_get_it_too() -> None:
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": RED, "detail": "high"}},
            ],
        }
    ]
    media = asyncio.run(MediaResolver(MemoryStore()).resolve_messages(chat, "owner"))
    [msg] = chat_messages(chat, low(media))
    assert msg.text == f"What is this?\n{SEEN}" and msg.images == []


def test_images_are_still_checked() -> None:
    with pytest.raises(APIError) as exc:
        translate([user(image("data:image/png;base64,AAAA"))])
    assert (exc.value.param, exc.value.code) == ("input[0].content[0].image_url", "invalid_image")
    with pytest.raises(APIError) as exc:
        translate([user(image(detail="huge"))])
    assert (exc.value.param, exc.value.code) == ("input[0].content[0].detail", "invalid_value")


def test_without_the_fallback_the_400_stays() -> None:
    with pytest.raises(APIError) as exc:
        translate(screenshot_items(), placeholders=False)
    assert (exc.value.status_code, exc.value.code) == (400, "unsupported_input")
    assert exc.value.param == "input[2].output[1]"


def test_a_vision_model_still_gets_the_image() -> None:
    items = [user(image())]
    media = asyncio.run(MediaResolver(MemoryStore()).resolve_items(items, "owner"))
    [msg] = input_to_messages(items, lowering=Lowering("m", True, media, image_placeholders=True))
    assert msg.content == msg.images and len(msg.images) == 1


# -- through the app -------------------------------------------------------------------------


def serve(placeholders: bool) -> tuple[FakeEngine, httpx.AsyncClient, openai.AsyncOpenAI]:
    engine = FakeEngine(model_id=FAKE_MODEL, respond=lambda prompt, params: Reply(["ok"]))
    fallback: ImageFallback = "placeholder" if placeholders else "error"
    app = create_app(engine, MemoryStore(), media=MediaSettings(image_input_fallback=fallback))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://respd.test")
    sdk = openai.AsyncOpenAI(
        base_url="http://respd.test/v1", api_key="sk-test", http_client=http, max_retries=0
    )
    return engine, http, sdk


async def test_a_screenshot_tool_result_is_answered_and_replays_from_the_cache() -> None:
    engine, http, sdk = serve(placeholders=True)
    async with http:
        first = await sdk.responses.create(model=FAKE_MODEL, input=screenshot_items())  # type: ignore[arg-type]
        assert first.status == "completed"
        prompt = engine.calls[-1].prompt.messages
        assert any(f"captured\n{SEEN}" in m.text for m in prompt)
        assert not any(m.images for m in prompt)
        chained = first
        for turn in ("And now?", "Once more?"):
            chained = await sdk.responses.create(
                model=FAKE_MODEL, input=turn, previous_response_id=chained.id
            )
            assert chained.status == "completed"
        health = (await http.get("/health")).json()
        assert health["media_cache"]["misses"] == 1 and health["media_cache"]["hits"] == 2
        assert health["media_cache"]["entries"] == 1
        assert health["media_cache"]["bytes"] == len(png())
        scrape = (await http.get("/metrics")).text
        assert "respd_media_cache_hits_total 2.0" in scrape
        assert "respd_media_cache_misses_total 1.0" in scrape
        assert f"respd_media_cache_bytes {float(len(png()))}" in scrape
        assert f'respd_images_tokenized_total{{model="{FAKE_MODEL}"}} 0.0' in scrape


async def test_chat_image_url_is_answered() -> None:
    engine, http, sdk = serve(placeholders=True)
    async with http:
        reply = await sdk.chat.completions.create(
            model=FAKE_MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": RED}},
                    ],
                }
            ],
        )
    assert reply.choices[0].message.content == "ok"
    assert engine.calls[-1].prompt.messages[-1].text == f"What is this?\n{SEEN}"


async def test_the_default_is_the_honest_400() -> None:
    _, http, sdk = serve(placeholders=False)
    async with http:
        with pytest.raises(openai.BadRequestError) as exc:
            await sdk.responses.create(model=FAKE_MODEL, input=screenshot_items())  # type: ignore[arg-type]
    assert exc.value.code == "unsupported_input"
