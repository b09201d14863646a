"""Unit tests of the media vocabulary: resolution (`service/media/resolver.py` and the checks
it calls) and lowering (`service/media/lowering.py`), without a server. Images are made here
with Pillow; lowering runs with `vision=True` (pure functions, no engine), as a vision model
would see it."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

import pytest
from PIL import Image as PILImage

from respd.engines.base import ChatMessage, Image
from respd.engines.chat_template import FALLBACK_TEMPLATE, ChatTemplate
from respd.engines.families.tools import generic_messages
from respd.engines.messages import ATTACHED_LINE, images_on_user_turns
from respd.engines.prompting import MEDIA_MARKER as MARKER
from respd.protocol.errors import APIError
from respd.service.media.documents import document_text
from respd.service.media.fetch import address_refused
from respd.service.media.images import check_image
from respd.service.media.lowering import Lowering, require_effective_input
from respd.service.media.resolver import MediaResolver
from respd.service.media.settings import MediaSettings
from respd.service.media.values import FileText
from respd.service.responses.items import normalize_items
from respd.service.responses.translate import input_to_messages
from respd.store import MemoryStore
from respd.store.base import FileRecord
from tests.support.servers import TEMPLATES


def png(color: str = "red", size: tuple[int, int] = (32, 32), fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


RED = data_uri(png("red"))
BLUE = data_uri(png("blue"))


def resolve(items: Any, settings: MediaSettings | None = None) -> dict[str, Any]:
    return asyncio.run(MediaResolver(MemoryStore(), settings).resolve_items(items, "owner"))


def translate(items: Any, *, vision: bool = True) -> list[ChatMessage]:
    media = resolve(items)
    return input_to_messages(items, lowering=Lowering("m", vision, media))


def templated(items: Any) -> list[ChatMessage]:
    """The turns as a chat template takes them (images on user turns only)."""
    return images_on_user_turns(translate(items))


def text(m: ChatMessage) -> str:
    """A turn's parts as a prompt holds them, each image as llama.cpp's marker."""
    return m.rendered(MARKER)


def shape(messages: list[ChatMessage]) -> list[tuple[Any, ...]]:
    """What a prompt is made of: roles, text, tool ids and each image's bytes and detail."""
    return [
        (
            m.role,
            text(m),
            m.tool_call_id,
            [(c.id, c.name, c.arguments) for c in m.tool_calls],
            [(i.digest, i.mime_type, i.detail) for i in m.images],
        )
        for m in messages
    ]


def error(exc: pytest.ExceptionInfo[APIError]) -> tuple[int, str | None, str | None]:
    return exc.value.status_code, exc.value.param, exc.value.code


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def call(call_id: str = "call_1", name: str = "screenshot") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(value: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": value}


# -- lowering --------------------------------------------------------------------------


def test_input_text_and_input_image_lower_to_text_then_image_with_detail() -> None:
    items = [
        user(
            {"type": "input_text", "text": "What colour is this?"},
            {"type": "input_image", "image_url": RED, "detail": "high"},
        )
    ]
    [msg] = translate(items)
    assert msg.role == "user"
    assert text(msg) == f"What colour is this?\n{MARKER}"
    [img] = msg.images
    assert img.mime_type == "image/png" and img.detail == "high"
    assert img.data == png("red")


def test_user_images_keep_their_position_between_texts() -> None:
    items = [
        user(
            {"type": "input_image", "image_url": RED},
            {"type": "input_text", "text": "versus"},
            {"type": "image_url", "image_url": {"url": BLUE, "detail": "low"}},
        )
    ]
    [msg] = translate(items)
    assert text(msg) == f"{MARKER}\nversus\n{MARKER}"
    assert [i.data for i in msg.images] == [png("red"), png("blue")]
    assert [i.detail for i in msg.images] == ["auto", "low"]


def test_input_file_lowers_to_a_named_text_block() -> None:
    doc = base64.b64encode(b"alpha\nbeta\n").decode()
    items = [
        user(
            {"type": "input_text", "text": "Summarise:"},
            {
                "type": "input_file",
                "filename": "notes.md",
                "file_data": f"data:text/markdown;base64,{doc}",
            },
        )
    ]
    [msg] = translate(items, vision=False)  # files are text: any model reads them
    assert text(msg) == 'Summarise:\n<file name="notes.md">\nalpha\nbeta\n</file>'
    assert msg.images == []


def test_function_output_image_stays_after_tool_result() -> None:
    items = [
        user({"type": "input_text", "text": "Take a screenshot."}),
        call(),
        output([{"type": "input_text", "text": "done"}, {"type": "input_image", "image_url": RED}]),
    ]
    messages = templated(items)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    tool, follow = messages[2], messages[3]
    assert text(tool) == f"done\n{ATTACHED_LINE}"
    assert text(tool).endswith("[Image output attached in the next message]")
    assert tool.images == []
    assert len(follow.images) == 1 and text(follow) == MARKER
    # Rendered through a tool template, the tool text comes before the image's marker.
    template = ChatTemplate((TEMPLATES / "qwen.jinja").read_text())
    prompt = template.render(
        [m.as_template_dict(MARKER) for m in messages], add_generation_prompt=True
    )
    assert prompt.count(MARKER) == 1
    assert prompt.index("done") < prompt.index(ATTACHED_LINE) < prompt.index(MARKER)


def test_function_output_keeps_text_alongside_visual_input_in_order() -> None:
    items = [
        call(),
        output(
            [
                {"type": "input_text", "text": "first"},
                {"type": "input_image", "image_url": RED},
                {"type": "input_text", "text": "second"},
                {"type": "input_image", "image_url": BLUE, "detail": "low"},
            ]
        ),
    ]
    messages = templated(items)
    tool, follow = messages[1], messages[2]
    assert text(tool) == f"first\nsecond\n{ATTACHED_LINE}"
    assert text(follow) == f"{MARKER}\n{MARKER}"
    assert [i.data for i in follow.images] == [png("red"), png("blue")]
    assert [i.detail for i in follow.images] == ["auto", "low"]


def test_function_output_string_is_unchanged() -> None:
    messages = translate([call(), output("  plain [text]\n")])
    assert [m.role for m in messages] == ["assistant", "tool"]
    assert text(messages[1]) == "  plain [text]\n"
    assert messages[1].images == []


def test_unknown_function_output_parts_remain_as_json_text() -> None:
    odd = {"type": "foo", "value": 1, "nested": {"a": [1, 2]}}
    messages = translate([call(), output([{"type": "input_text", "text": "hi"}, odd])])
    tool = messages[1]
    assert len(messages) == 2 and tool.images == []
    assert text(tool) == "hi\n" + json.dumps([odd], separators=(",", ":"))
    assert json.loads(text(tool).split("\n", 1)[1]) == [odd]


def test_lowering_keeps_every_turns_images_in_place() -> None:
    items = [
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "see"},
                {"type": "input_image", "image_url": RED},
                {"type": "output_text", "text": "there"},
            ],
        },
        call(),
        output([{"type": "input_image", "image_url": BLUE}, {"type": "input_text", "text": "ok"}]),
    ]
    assistant, _, tool = translate(items)
    assert [type(p).__name__ for p in assistant.content] == ["TextPart", "Image", "TextPart"]
    assert text(assistant) == f"see\n{MARKER}\nthere"
    assert text(tool) == f"{MARKER}\nok" and tool.images[0].data == png("blue")


def test_assistant_system_and_developer_images_move_to_a_following_user_turn() -> None:
    for role, lowered in (
        ("assistant", "assistant"),
        ("system", "system"),
        ("developer", "system"),
    ):
        items = [
            {
                "type": "message",
                "role": role,
                "content": [
                    {"type": "input_text" if role != "assistant" else "output_text", "text": "see"},
                    {"type": "input_image", "image_url": RED},
                ],
            }
        ]
        messages = templated(items)
        assert [(m.role, text(m)) for m in messages] == [(lowered, "see"), ("user", MARKER)]
        assert messages[0].images == [] and len(messages[1].images) == 1


def test_image_only_request_is_effective_input() -> None:
    messages = translate([user({"type": "input_image", "image_url": RED})])
    require_effective_input(messages)  # no raise
    with pytest.raises(APIError):
        require_effective_input([ChatMessage("user", "  ")])
    require_effective_input([ChatMessage("user", [Image(b"x")])])


def test_stored_response_with_image_tool_output_replays_identically() -> None:
    items = [
        user({"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": RED}),
        call(),
        output(
            [{"type": "input_text", "text": "captured"}, {"type": "input_image", "image_url": BLUE}]
        ),
    ]
    first = translate(items)
    stored = normalize_items(items)
    # Stored in the wire shape: the data URI as given, never decoded bytes.
    assert stored[0]["content"][1] == {"type": "input_image", "image_url": RED, "detail": "auto"}
    assert stored[2]["output"][1]["image_url"] == BLUE
    stored = json.loads(json.dumps(stored))  # as a store gives it back
    assert shape(translate(stored)) == shape(first)


def test_chat_spelling_is_stored_as_input_image() -> None:
    stored = normalize_items(
        [user({"type": "image_url", "image_url": {"url": RED, "detail": "low"}})]
    )
    assert stored[0]["content"] == [{"type": "input_image", "image_url": RED, "detail": "low"}]
    assert shape(translate(stored)) == shape(
        translate([user({"type": "image_url", "image_url": {"url": RED, "detail": "low"}})])
    )


def test_images_survive_the_generic_tool_rewrite() -> None:
    items = [
        user({"type": "input_text", "text": "Take one"}),
        call(),
        output([{"type": "input_text", "text": "ok"}, {"type": "input_image", "image_url": RED}]),
    ]
    messages = generic_messages(templated(items), [{"type": "function", "function": {"name": "f"}}])
    rendered = ChatTemplate(FALLBACK_TEMPLATE).render(
        [m.as_template_dict(MARKER) for m in messages], add_generation_prompt=True
    )
    assert sum(len(m.images) for m in messages) == 1
    assert rendered.count(MARKER) == 1
    assert rendered.index("<tool_response>\nok\n" + ATTACHED_LINE) < rendered.index(MARKER)


# -- errors of translation ------------------------------------------------------------------


def test_text_only_model_names_itself_and_the_part() -> None:
    items = [user({"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": RED})]
    with pytest.raises(APIError) as exc:
        translate(items, vision=False)
    assert error(exc) == (400, "input[0].content[1]", "unsupported_input")
    assert "'m'" in exc.value.message and "image" in exc.value.message


def test_invalid_image_fails_before_the_capability_check() -> None:
    items = [user({"type": "input_image", "image_url": "data:image/png;base64,AAAA"})]
    with pytest.raises(APIError) as exc:
        translate(items, vision=False)
    assert error(exc) == (400, "input[0].content[0].image_url", "invalid_image")


def test_bad_detail_and_audio_are_named() -> None:
    with pytest.raises(APIError) as exc:
        translate([user({"type": "input_image", "image_url": RED, "detail": "huge"})])
    assert error(exc) == (400, "input[0].content[0].detail", "invalid_value")
    with pytest.raises(APIError) as exc:
        translate([user({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})])
    assert error(exc) == (400, "input[0].content[0].type", "unsupported_input")
    assert "audio" in exc.value.message


def test_unknown_message_part_is_rejected() -> None:
    with pytest.raises(APIError) as exc:
        translate([user({"type": "foo"})])
    assert error(exc) == (400, "input[0].content[0].type", "invalid_value")


# -- image checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_supported_formats_decode_with_their_real_type(fmt: str) -> None:
    img = check_image(png(fmt=fmt), "", "p", MediaSettings())
    assert img.mime_type == f"image/{fmt.lower()}".replace("jpeg", "jpeg")


def test_image_errors_name_the_param_and_reason() -> None:
    settings = MediaSettings(max_image_bytes=10_000, max_image_pixels=64 * 64, max_image_side=100)
    cases = [
        (b"", "", "empty_image_file"),
        (b"not an image at all", "image/png", "invalid_image"),
        (png()[:60], "image/png", "invalid_image"),  # truncated
        (png(size=(200, 10)), "image/png", "image_too_large"),  # a side over 100
        (png(size=(90, 90)), "image/png", "image_too_large"),  # 8100 pixels over 4096
        (png(), "image/svg+xml", "unsupported_image_media_type"),
        (png(fmt="TIFF"), "", "unsupported_image_media_type"),
        (b"\x00" * 10_001, "image/png", "image_file_too_large"),
    ]
    for data, declared, code in cases:
        with pytest.raises(APIError) as exc:
            check_image(data, declared, "input[0].content[0].image_url", settings)
        assert error(exc) == (400, "input[0].content[0].image_url", code), code
    with pytest.raises(APIError) as exc:
        check_image(png(fmt="TIFF"), "", "p", settings)
    assert "image/tiff" in exc.value.message


def test_decompression_bomb_is_refused_from_its_header() -> None:
    # A 20000x20000 1-bit PNG compresses to a few KB but would decode to 400M pixels.
    buf = io.BytesIO()
    PILImage.new("1", (20000, 20000)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 200_000
    with pytest.raises(APIError) as exc:
        check_image(buf.getvalue(), "image/png", "p", MediaSettings(max_image_side=100_000))
    assert exc.value.code == "image_too_large"


def test_data_uri_errors() -> None:
    cases = [
        ("data:image/png;base64,@@@@", "invalid_base64_image"),
        ("data:image/png;base64", "invalid_base64_image"),
        ("ftp://example.com/x.png", "invalid_image_url"),
        ("https://example.com/x.png", "remote_media_disabled"),
    ]
    for url, code in cases:
        with pytest.raises(APIError) as exc:
            resolve([user({"type": "input_image", "image_url": url})])
        assert error(exc) == (400, "input[0].content[0].image_url", code), url
    with pytest.raises(APIError) as exc:
        resolve([user({"type": "input_image", "detail": "auto"})])
    assert exc.value.param == "input[0].content[0].image_url"
    # Too big is refused from the base64 length, before decoding.
    big = "data:image/png;base64," + "A" * 4000
    with pytest.raises(APIError) as exc:
        resolve(
            [user({"type": "input_image", "image_url": big})], MediaSettings(max_image_bytes=100)
        )
    assert exc.value.code == "image_file_too_large"


def test_unknown_file_id_is_a_404_naming_the_param() -> None:
    with pytest.raises(APIError) as exc:
        resolve([call(), output([{"type": "input_image", "file_id": "file-nope"}])])
    assert error(exc)[:2] == (404, "input[1].output[0].file_id")
    assert "file-nope" in exc.value.message
    with pytest.raises(APIError) as exc:
        resolve([user({"type": "input_file", "file_id": "file-nope"})])
    assert error(exc)[:2] == (404, "input[0].content[0].file_id")


def test_file_ids_resolve_through_the_store_for_their_owner_only() -> None:
    store = MemoryStore()

    async def go() -> tuple[dict[str, Any], APIError]:
        for fid, name, mime, data in (
            ("file-img", "red.png", "image/png", png("red")),
            ("file-doc", "notes.txt", "text/plain", b"remember the milk\n"),
        ):
            record = FileRecord(fid, "owner", 0, name, "user_data", len(data), mime)
            await store.save_file(record, data)
        items = [
            user(
                {"type": "input_image", "file_id": "file-img", "detail": "low"},
                {"type": "input_file", "file_id": "file-doc"},
            )
        ]
        resolver = MediaResolver(store)
        found = await resolver.resolve_items(items, "owner")
        try:
            await resolver.resolve_items(items, "someone-else")
        except APIError as exc:
            return found, exc
        raise AssertionError("another owner resolved the file")

    media, other = asyncio.run(go())
    items = [
        user(
            {"type": "input_image", "file_id": "file-img", "detail": "low"},
            {"type": "input_file", "file_id": "file-doc"},
        )
    ]
    [msg] = input_to_messages(items, lowering=Lowering("m", True, media))
    assert text(msg) == f'{MARKER}\n<file name="notes.txt">\nremember the milk\n</file>'
    assert msg.images[0].data == png("red") and msg.images[0].detail == "low"
    assert (other.status_code, other.param) == (404, "input[0].content[0].file_id")


# -- remote addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "224.0.0.1",
        "240.0.0.1",
    ],
)
def test_private_and_reserved_addresses_are_refused(address: str) -> None:
    assert address_refused(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert not address_refused(address)


# -- documents --------------------------------------------------------------------------------


def test_text_documents_by_type_and_extension() -> None:
    assert document_text(b"a,b\n1,2\n", "text/csv", "t.csv", "p") == FileText("t.csv", "a,b\n1,2")
    assert document_text(b'{"k": 1}', "application/json", "x", "p").text == '{"k": 1}'
    assert document_text(b"print(1)\n", "", "main.py", "p").text == "print(1)"
    assert (
        document_text(b"print(1)\n", "application/octet-stream", "main.py", "p").text == "print(1)"
    )
    assert FileText('a"b.txt', "x").block() == '<file name="a\'b.txt">\nx\n</file>'


def test_document_errors() -> None:
    cases = [
        (b"\xff\xfe\x00bad", "text/plain", "a.txt", "invalid_file_encoding"),
        (b"PK\x03\x04zip", "application/zip", "a.zip", "unsupported_file_type"),
        (b"\x00\x01", "application/octet-stream", "blob.bin", "unsupported_file_type"),
        (b"%PDF-1.4 garbage", "application/pdf", "a.pdf", "invalid_file"),
    ]
    for data, mime, name, code in cases:
        with pytest.raises(APIError) as exc:
            document_text(data, mime, name, "input[0].content[0].file_data")
        assert error(exc) == (400, "input[0].content[0].file_data", code), name
    with pytest.raises(APIError) as exc:
        document_text(b"PK", "application/zip", "a.zip", "p")
    assert "application/zip" in exc.value.message


def make_pdf(text: str | None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    if text is not None:
        pdf.set_font("Helvetica", size=12)
        pdf.cell(text=text)
    return bytes(pdf.output())


def test_pdf_text_is_extracted_and_an_empty_pdf_refused() -> None:
    got = document_text(make_pdf("The secret word is pineapple."), "application/pdf", "r.pdf", "p")
    assert got == FileText("r.pdf", "The secret word is pineapple.")
    with pytest.raises(APIError) as exc:
        document_text(make_pdf(None), "application/pdf", "blank.pdf", "p")
    assert exc.value.code == "file_has_no_text"


def test_input_file_in_tool_output_is_text_and_needs_one_source() -> None:
    doc = "data:text/plain;base64," + base64.b64encode(b"result body").decode()
    messages = translate(
        [call(), output([{"type": "input_file", "filename": "r.txt", "file_data": doc}])]
    )
    assert text(messages[1]) == '<file name="r.txt">\nresult body\n</file>'
    with pytest.raises(APIError) as exc:
        resolve([user({"type": "input_file", "file_data": doc, "file_url": "https://x/y"})])
    assert exc.value.param == "input[0].content[0].file_url"
    with pytest.raises(APIError) as exc:
        resolve([user({"type": "input_file", "filename": "x.txt"})])
    assert error(exc) == (400, "input[0].content[0].file_id", "missing_required_parameter")
