"""`POST /v1/chat/completions`, `/v1/models` and `/health` through the real SDK."""

from __future__ import annotations

import httpx
import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.support.servers import MODEL_ID


def test_chat_non_stream(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL_ID,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        ],
        max_tokens=16,
        temperature=0,
    )
    assert isinstance(out, ChatCompletion)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details is not None


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes in (["stop"], ["length"])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens > 0
    same = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=20,
        temperature=0,
    )
    assert same.choices[0].message.content == text
    assert same.usage and same.usage.completion_tokens == usage_chunk.usage.completion_tokens


def test_chat_stream_without_usage_has_no_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_stop_sequence(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "List the days of the week."}],
        max_tokens=40,
        temperature=0,
    )
    text = base.choices[0].message.content or ""
    assert len(text) > 6
    stop = text[4:7]
    cut = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "List the days of the week."}],
        max_tokens=40,
        temperature=0,
        stop=[stop],
    )
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "List the days of the week."}],
            max_tokens=40,
            temperature=0,
            stop=stop,
            stream=True,
        )
        if c.choices
    )
    assert streamed == text[: text.index(stop)]


def test_chat_max_tokens_length(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Write a poem."}],
        max_completion_tokens=3,
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage and out.usage.completion_tokens == 3


def test_models_and_health(client: openai.OpenAI, http: httpx.Client) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert http.get("/models").status_code == 200
