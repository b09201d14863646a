"""Content parts, images and `input_file` end to end: real servers with the default text-only
model, driven by the `openai` SDK. What the model sees is proved with exact prompt token
counts (`responses.input_tokens.count`) against the documented lowering sent as text."""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from PIL import Image as PILImage

from tests.support.servers import MODEL_ID, RespdServer, start_server


def png(color: str = "red", size: tuple[int, int] = (32, 32)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def noise_png(side: int) -> bytes:
    buf = io.BytesIO()
    PILImage.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def make_pdf(text: str) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.cell(text=text)
    return bytes(pdf.output())


RED = data_url(png(), "image/png")
NOTES = b"Meeting notes\nAda: the launch moves to Thursday.\nBob: fine.\n"
NOTES_BLOCK = (
    '<file name="notes.md">\nMeeting notes\nAda: the launch moves to Thursday.\nBob: fine.\n</file>'
)


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": list(parts)}


def text(value: str) -> dict[str, Any]:
    return {"type": "input_text", "text": value}


def image(url: str = RED, detail: str = "auto") -> dict[str, Any]:
    return {"type": "input_image", "image_url": url, "detail": detail}


def bad_request(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as exc:
        call()
    return exc.value


def count(client: openai.OpenAI, **body: Any) -> int:
    return client.responses.input_tokens.count(model=MODEL_ID, **body).input_tokens


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """Small limits and remote fetching switched on."""
    srv = start_server(
        tmp_path_factory.mktemp("respd-media"),
        "--store",
        "memory",
        "--allow-remote-media",
        "--max-image-bytes",
        "4000",
        "--max-image-side",
        "64",
        "--max-input-file-bytes",
        "1000",
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


# -- images on a text-only model ----------------------------------------------------------------


def test_image_on_text_only_model_is_a_400_naming_the_model(client: openai.OpenAI) -> None:
    err = bad_request(
        lambda: client.responses.create(
            model=MODEL_ID, input=[user(text("What colour?"), image(detail="high"))]
        )
    )
    assert err.code == "unsupported_input"
    assert err.param == "input[0].content[1]"
    assert MODEL_ID in err.message and "no image input" in err.message
    # An image-only request is real input: the same 400, not "no effective input".
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(image())]))
    assert (err.code, err.param) == ("unsupported_input", "input[0].content[0]")


def test_image_in_a_tool_output_on_text_only_model(client: openai.OpenAI) -> None:
    items: list[Any] = [
        user(text("Take a screenshot.")),
        {"type": "function_call", "call_id": "call_s", "name": "shot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_s",
            "output": [text("captured"), image()],
        },
    ]
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=items))
    assert (err.code, err.param) == ("unsupported_input", "input[2].output[1]")


def test_chat_completions_image_on_text_only_model(client: openai.OpenAI) -> None:
    err = bad_request(
        lambda: client.chat.completions.create(
            model=MODEL_ID,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What colour?"},
                        {"type": "image_url", "image_url": {"url": RED, "detail": "low"}},
                    ],
                }
            ],
        )
    )
    assert (err.code, err.param) == ("unsupported_input", "messages[0].content[1]")
    assert MODEL_ID in err.message
    err = bad_request(
        lambda: client.chat.completions.create(
            model=MODEL_ID,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}
                    ],
                }
            ],
        )
    )
    assert (err.code, err.param) == ("invalid_base64_image", "messages[0].content[0].image_url.url")


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,%%%not-base64", "invalid_base64_image"),
        (data_url(b"this is not an image", "image/png"), "invalid_image"),
        (data_url(png(), "image/tiff"), "unsupported_image_media_type"),
        ("https://example.com/cat.png", "remote_media_disabled"),
        ("file:///etc/passwd", "invalid_image_url"),
    ],
)
def test_bad_images_are_400s_naming_the_part(client: openai.OpenAI, url: str, code: str) -> None:
    items = [user(text("look"), image(url))]
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=items))
    assert (err.code, err.param) == (code, "input[0].content[1].image_url")
    if code == "unsupported_image_media_type":
        assert "image/tiff" in err.message
    if code == "remote_media_disabled":
        assert "--allow-remote-media" in err.message


def test_audio_input_is_a_named_400(client: openai.OpenAI) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    err = bad_request(
        lambda: client.responses.create(model=MODEL_ID, input=[user(text("hi"), part)])
    )
    assert (err.code, err.param) == ("unsupported_input", "input[0].content[1].type")
    assert "audio" in err.message


def test_image_limits_name_the_exact_part(media_server: RespdServer) -> None:
    client = media_server.client()
    big_bytes = data_url(noise_png(60), "image/png")  # ~10 KB, over 4000 bytes
    wide = data_url(png(size=(65, 8)), "image/png")  # a side over 64
    items: list[Any] = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [text("ok"), image(big_bytes)]},
    ]
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=items))
    assert (err.code, err.param) == ("image_file_too_large", "input[1].output[1].image_url")
    err = bad_request(
        lambda: client.responses.create(model=MODEL_ID, input=[user(text("a"), image(wide))])
    )
    assert (err.code, err.param) == ("image_too_large", "input[0].content[1].image_url")
    # A small valid image passes every check and reaches the capability check.
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(image())]))
    assert err.code == "unsupported_input"


def test_remote_fetch_refuses_loopback(media_server: RespdServer) -> None:
    client = media_server.client()
    spellings = ("0177.0.0.1", "0x7f.1", "2130706433", "127.1", "[::ffff:127.0.0.1]")
    for host in ("127.0.0.1", "localhost", *spellings):
        url = f"http://{host}:{media_server.port}/health"
        err = bad_request(
            lambda url=url: client.responses.create(model=MODEL_ID, input=[user(image(url))])
        )
        assert (err.code, err.param) == (
            "remote_address_not_allowed",
            "input[0].content[0].image_url",
        )
        assert "127.0.0.1" in err.message or "7f00:1" in err.message
    doc = {"type": "input_file", "file_url": f"http://127.0.0.1:{media_server.port}/x.txt"}
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(doc)]))
    assert (err.code, err.param) == ("remote_address_not_allowed", "input[0].content[0].file_url")


# -- input_file -------------------------------------------------------------------------------


def test_input_file_text_is_what_the_model_sees(client: openai.OpenAI) -> None:
    part = {
        "type": "input_file",
        "filename": "notes.md",
        "file_data": data_url(NOTES, "text/markdown"),
    }
    as_file = [user(text("When is the launch?"), part)]
    as_text = [user(text("When is the launch?\n" + NOTES_BLOCK))]
    n = count(client, input=as_file)
    assert n == count(client, input=as_text)
    assert n > count(client, input=[user(text("When is the launch?"))]) + 10
    resp = client.responses.create(model=MODEL_ID, input=as_file, max_output_tokens=8)
    assert resp.status in ("completed", "incomplete")
    assert resp.usage is not None and resp.usage.input_tokens == n
    # The stored item keeps the part as sent.
    [item] = client.responses.input_items.list(resp.id).data
    assert item.type == "message"
    assert item.content[1].model_dump(exclude_none=True)["file_data"] == part["file_data"]


def test_uploaded_pdf_by_file_id(client: openai.OpenAI) -> None:
    pdf = make_pdf("The secret word is pineapple.")
    uploaded = client.files.create(file=("report.pdf", pdf, "application/pdf"), purpose="user_data")
    part = {"type": "input_file", "file_id": uploaded.id}
    block = '<file name="report.pdf">\nThe secret word is pineapple.\n</file>'
    n = count(client, input=[user(part, text("What is the secret word?"))])
    assert n == count(client, input=[user(text(block + "\nWhat is the secret word?"))])
    resp = client.responses.create(
        model=MODEL_ID, input=[user(part, text("What is the secret word?"))], max_output_tokens=8
    )
    assert resp.usage is not None and resp.usage.input_tokens == n
    # The same PDF inline, under its own name.
    inline = {
        "type": "input_file",
        "filename": "report.pdf",
        "file_data": data_url(pdf, "application/pdf"),
    }
    assert count(client, input=[user(inline, text("What is the secret word?"))]) == n
    # An unknown file_id is a 404 naming it.
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(
            model=MODEL_ID, input=[user({"type": "input_file", "file_id": "file-missing"})]
        )
    assert exc.value.param == "input[0].content[0].file_id"


def test_uploaded_image_by_file_id_reaches_the_capability_check(client: openai.OpenAI) -> None:
    uploaded = client.files.create(file=("red.png", png(), "image/png"), purpose="vision")
    part = {"type": "input_image", "file_id": uploaded.id, "detail": "low"}
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(part)]))
    assert (err.code, err.param) == ("unsupported_input", "input[0].content[0]")
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(
            model=MODEL_ID, input=[user({"type": "input_image", "file_id": "file-nope"})]
        )
    assert nf.value.param == "input[0].content[0].file_id"


@pytest.mark.parametrize(
    ("name", "mime", "data", "code", "named"),
    [
        ("a.zip", "application/zip", b"PK\x03\x04rest", "unsupported_file_type", "application/zip"),
        ("s.png", "image/png", png(), "unsupported_file_type", "image/png"),
        ("latin1.txt", "text/plain", "caf\xe9".encode("latin-1"), "invalid_file_encoding", "UTF-8"),
        ("empty.pdf", "application/pdf", b"%PDF-1.4\n%%EOF", "invalid_file", "empty.pdf"),
    ],
)
def test_bad_files_are_400s(
    client: openai.OpenAI, name: str, mime: str, data: bytes, code: str, named: str
) -> None:
    part = {"type": "input_file", "filename": name, "file_data": data_url(data, mime)}
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(part)]))
    assert (err.code, err.param) == (code, "input[0].content[0].file_data")
    assert named in err.message


def test_inline_file_limit(media_server: RespdServer) -> None:
    client = media_server.client()
    part = {
        "type": "input_file",
        "filename": "big.txt",
        "file_data": data_url(b"x" * 1001, "text/plain"),
    }
    err = bad_request(lambda: client.responses.create(model=MODEL_ID, input=[user(part)]))
    assert (err.code, err.param) == ("file_too_large", "input[0].content[0].file_data")


def test_failed_requests_store_nothing(client: openai.OpenAI) -> None:
    conv = client.conversations.create()
    bad = [
        [user(text("look"), image())],  # text-only model
        [user(image("data:image/png;base64,@@"))],
        [
            user(
                {
                    "type": "input_file",
                    "filename": "a.zip",
                    "file_data": data_url(b"PK", "application/zip"),
                }
            )
        ],
        [user({"type": "input_file", "file_id": "file-missing"})],
    ]
    for items in bad:
        with pytest.raises(openai.APIStatusError) as exc:
            client.responses.create(model=MODEL_ID, input=items, conversation=conv.id)
        assert exc.value.status_code in (400, 404)
    assert client.conversations.items.list(conv.id).data == []


# -- replay ----------------------------------------------------------------------------------


def test_tool_output_with_a_file_replays_identically(client: openai.OpenAI) -> None:
    """A stored turn whose tool output carried a document lowers the same way when a later
    turn continues it with previous_response_id."""
    doc = {
        "type": "input_file",
        "filename": "notes.md",
        "file_data": data_url(NOTES, "text/markdown"),
    }
    first_input: list[Any] = [
        user(text("Fetch the notes.")),
        {"type": "function_call", "call_id": "call_n", "name": "notes", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_n",
            "output": [text("fetched"), doc, {"type": "foo", "keep": 1}],
        },
    ]
    first = client.responses.create(model=MODEL_ID, input=first_input, max_output_tokens=6)
    follow = [user(text("And who answered?"))]
    chained = count(client, previous_response_id=first.id, input=follow)
    replayed = [
        *first_input,
        *[o.model_dump(mode="json", exclude_none=True) for o in first.output],
        *follow,
    ]
    assert chained == count(client, input=replayed)
    # The tool output's lowering is what the model saw: text, the file block, the JSON line.
    lowered = [
        user(text("Fetch the notes.")),
        first_input[1],
        {
            "type": "function_call_output",
            "call_id": "call_n",
            "output": "fetched\n" + NOTES_BLOCK + '\n[{"type":"foo","keep":1}]',
        },
    ]
    assert count(client, input=first_input) == count(client, input=lowered)


def test_chat_completions_file_part_is_the_same_text(client: openai.OpenAI) -> None:
    question = {"type": "text", "text": "When is the launch?"}
    part = {
        "type": "file",
        "file": {"filename": "notes.md", "file_data": data_url(NOTES, "text/markdown")},
    }
    as_file = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": [question, part]}], max_tokens=1
    )
    as_text = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "When is the launch?\n" + NOTES_BLOCK}],
        max_tokens=1,
    )
    assert as_file.usage is not None and as_text.usage is not None
    assert as_file.usage.prompt_tokens == as_text.usage.prompt_tokens > 30


def test_conversation_items_are_checked_and_refused_by_a_text_only_model(
    client: openai.OpenAI,
) -> None:
    err = bad_request(
        lambda: client.conversations.create(items=[user(image("data:image/png;base64,@@"))])
    )
    assert (err.code, err.param) == ("invalid_base64_image", "items[0].content[0].image_url")
    # A valid image is kept (a conversation is not tied to a model), stored as sent...
    conv = client.conversations.create(items=[user(text("look"), image(detail="low"))])
    [item] = client.conversations.items.list(conv.id).data
    assert item.type == "message"
    assert item.content[1].model_dump(exclude_none=True) == image(detail="low")
    # ...and this text-only model refuses it when the conversation is used.
    err = bad_request(
        lambda: client.responses.create(model=MODEL_ID, conversation=conv.id, input="and?")
    )
    assert err.code == "unsupported_input" and MODEL_ID in err.message
    assert len(client.conversations.items.list(conv.id).data) == 1
