"""The official `openai` Python SDK, sync and async, through its own helpers."""

from __future__ import annotations

import asyncio
import time
from enum import StrEnum
from typing import Literal

import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseTextDeltaEvent,
)
from pydantic import BaseModel, Field

from tests.clients.capture import CaptureProxy
from tests.support.servers import MODEL_ID

CLIENT = "openai-python"


def sync_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=300)


def async_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=300)


@pytest.mark.flow(CLIENT, "create")
def test_create(base_url: str) -> None:
    response = sync_client(base_url).responses.create(
        model=MODEL_ID, input="Say hello.", temperature=0, max_output_tokens=30
    )
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert response.usage is not None and response.usage.output_tokens > 0


@pytest.mark.flow(CLIENT, "stream-helper")
def test_stream_helper(base_url: str) -> None:
    deltas: list[str] = []
    kinds: list[str] = []
    with sync_client(base_url).responses.stream(
        model=MODEL_ID, input="Name a colour.", temperature=0, max_output_tokens=150
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if isinstance(event, ResponseTextDeltaEvent):
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert deltas and "".join(deltas) == final.output_text


@pytest.mark.flow(CLIENT, "async-stream-helper")
def test_async_stream_helper(base_url: str) -> None:
    async def run() -> tuple[str, str]:
        client = async_client(base_url)
        text = ""
        async with client.responses.stream(
            model=MODEL_ID, input="What is 2+2?", temperature=0, max_output_tokens=150
        ) as stream:
            async for event in stream:
                if isinstance(event, ResponseTextDeltaEvent):
                    text += event.delta
            final = await stream.get_final_response()
        await client.close()
        return text, final.output_text

    streamed, final = asyncio.run(run())
    assert streamed and streamed == final


class Colour(StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class Dimensions(BaseModel):
    width: int = Field(ge=1, le=100)
    height: int = Field(ge=1, le=100)


class Product(BaseModel):
    name: str
    rating: int = Field(ge=1, le=10)
    size: Literal["small", "medium", "large"]
    colour: Colour
    dimensions: Dimensions
    note: str | None


@pytest.mark.flow(CLIENT, "parse")
def test_parse_with_bounds_enums_nested_optional(base_url: str) -> None:
    """The schema pydantic writes for bounds, Literal, Enum, nested models and Optional is
    accepted, and the grammar keeps every value within it."""
    client = sync_client(base_url)
    for prompt in ("Describe a lamp as a product.", "A red chair, rated 42 out of 10."):
        response = client.responses.parse(
            model=MODEL_ID,
            input=prompt,
            text_format=Product,
            temperature=0,
            max_output_tokens=200,
        )
        product = response.output_parsed
        assert isinstance(product, Product), response.output_text
        assert 1 <= product.rating <= 10
        assert 1 <= product.dimensions.width <= 100 and 1 <= product.dimensions.height <= 100
        assert product.size in ("small", "medium", "large")


@pytest.mark.flow(CLIENT, "async-parse")
def test_async_parse(base_url: str) -> None:
    async def run() -> Dimensions | None:
        client = async_client(base_url)
        response = await client.responses.parse(
            model=MODEL_ID,
            input="Give the size of a door in decimetres.",
            text_format=Dimensions,
            temperature=0,
            max_output_tokens=60,
        )
        await client.close()
        return response.output_parsed

    parsed = asyncio.run(run())
    assert parsed is not None and 1 <= parsed.width <= 100


@pytest.mark.flow(CLIENT, "retrieve-stream")
def test_background_then_retrieve_stream(base_url: str) -> None:
    client = sync_client(base_url)
    job = client.responses.create(
        model=MODEL_ID,
        input="Count to five.",
        background=True,
        temperature=0,
        max_output_tokens=40,
    )
    assert job.status in ("queued", "in_progress")
    events = list(client.responses.retrieve(job.id, stream=True))
    assert isinstance(events[0], ResponseCreatedEvent | ResponseInProgressEvent)
    assert isinstance(events[-1], ResponseCompletedEvent | ResponseIncompleteEvent)
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert text == client.responses.retrieve(job.id).output_text


@pytest.mark.flow(CLIENT, "input-items-pagination")
def test_input_items_auto_pagination(base_url: str) -> None:
    client = sync_client(base_url)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message number {i}."}
        for i in range(7)
    ]
    response = client.responses.create(
        model=MODEL_ID,
        input=turns,
        temperature=0,
        max_output_tokens=10,  # type: ignore[arg-type]
    )
    page = client.responses.input_items.list(response.id, limit=2, order="asc")
    assert len(page.data) == 2 and page.has_more
    items = list(page)  # the SDK follows `after` cursors page by page
    assert len(items) == 7
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == [f"Message number {i}." for i in range(7)]


@pytest.mark.flow(CLIENT, "conversations")
def test_conversations(base_url: str) -> None:
    client = sync_client(base_url)
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
        metadata={"topic": "names"},
    )
    first = client.responses.create(
        model=MODEL_ID,
        conversation=conversation.id,
        input="Hello!",
        temperature=0,
        max_output_tokens=20,
    )
    second = client.responses.create(
        model=MODEL_ID,
        conversation=conversation.id,
        input="What is my name?",
        temperature=0,
        max_output_tokens=20,
    )
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    user_texts = [
        part.text  # type: ignore[union-attr]
        for item in items
        if item.type == "message" and item.role == "user"
        for part in item.content
    ]
    assert user_texts == ["My name is Ada.", "Hello!", "What is my name?"]
    assistant = [i for i in items if i.type == "message" and i.role == "assistant"]
    assert [a.id for a in assistant] == [first.output[-1].id, second.output[-1].id]
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "names"}
    assert client.conversations.delete(conversation.id).deleted


@pytest.mark.flow(CLIENT, "input-tokens")
def test_input_tokens_count(base_url: str) -> None:
    client = sync_client(base_url)
    short = client.responses.input_tokens.count(model=MODEL_ID, input="Hi")
    long = client.responses.input_tokens.count(
        model=MODEL_ID, input="Hi " * 50, instructions="Be brief."
    )
    assert short.object == "response.input_tokens"
    assert 0 < short.input_tokens < long.input_tokens


@pytest.mark.flow(CLIENT, "files")
def test_files(base_url: str, proxy: CaptureProxy) -> None:
    client = sync_client(base_url)
    uploaded = client.files.create(
        file=("facts.txt", b"The secret word is PAPAYA.\n", "text/plain"), purpose="user_data"
    )
    assert uploaded.filename == "facts.txt" and uploaded.bytes == 27
    assert client.files.content(uploaded.id).read() == b"The secret word is PAPAYA.\n"
    response = client.responses.create(
        model=MODEL_ID,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_file", "file_id": uploaded.id},
                    {"type": "input_text", "text": "What is the secret word?"},
                ],
            }
        ],
        temperature=0,
        max_output_tokens=20,
    )
    assert response.status in ("completed", "incomplete")
    counted = client.responses.input_tokens.count(
        model=MODEL_ID,
        input=[{"role": "user", "content": [{"type": "input_file", "file_id": uploaded.id}]}],
    )
    assert counted.input_tokens > 5  # the file's text went into the prompt
    assert uploaded.id in [f.id for f in client.files.list()]
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    assert any(r.path == "/v1/files" and r.method == "POST" for r in proxy.seen(CLIENT, "files"))


@pytest.mark.flow(CLIENT, "async-create-concurrent")
def test_async_concurrent_creates(base_url: str) -> None:
    async def run() -> list[openai.types.responses.Response]:
        client = async_client(base_url)
        started = time.monotonic()
        results = await asyncio.gather(
            *(
                client.responses.create(
                    model=MODEL_ID,
                    input=f"Say the number {n}.",
                    temperature=0,
                    max_output_tokens=15,
                )
                for n in range(4)
            )
        )
        assert time.monotonic() - started < 300
        await client.close()
        return list(results)

    results = asyncio.run(run())
    assert len({r.id for r in results}) == 4
    assert all(r.output_text.strip() for r in results)
