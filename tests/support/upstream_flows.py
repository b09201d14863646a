"""Responses flows run through respd in front of an upstream engine (another respd,
llama-server): each takes `create`, a function making one strictly validated response
through the front with that front's model id."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
from openai.types.responses import Response

from tests.support.stateful import LONG_PROMPT, poll

Create = Callable[..., Response]
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def forced_call(create: Create, choice: Any) -> None:
    resp = create(
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=100,
    )
    calls = [o for o in resp.output if o.type == "function_call"]
    assert resp.status == "completed" and resp.output == calls and len(calls) == 1, resp.output
    assert calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)


def schema_answer(create: Create) -> None:
    fmt = {"type": "json_schema", "name": "a", "schema": ANSWER_SCHEMA, "strict": True}
    answer = create(
        input="What is the capital of France?", text={"format": fmt}, max_output_tokens=100
    )
    assert answer.status == "completed", answer.output
    assert isinstance(json.loads(answer.output_text)["answer"], str)


def chain_and_conversation(client: openai.OpenAI, create: Create) -> None:
    first = create(input="My name is Ada. Say ok.", temperature=0, max_output_tokens=16)
    second = create(input="And again.", previous_response_id=first.id, max_output_tokens=16)
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the chain was sent
    assert [i.type for i in client.responses.input_items.list(second.id).data][-1] == "message"
    conv = client.conversations.create()
    create(input="Say hi.", conversation=conv.id, max_output_tokens=8)
    assert len(client.conversations.items.list(conv.id).data) == 2  # the turn and the answer


def background_and_cancel(client: openai.OpenAI, create: Create) -> None:
    quick = create(input="Say hi.", background=True, max_output_tokens=8)
    assert quick.status == "queued"
    done = poll(client, quick.id, lambda r: r.status not in ("queued", "in_progress"))
    assert done.status in ("completed", "incomplete")
    # Greedy: the count goes on (a sampled answer may end after a few words).
    job = create(input=LONG_PROMPT, background=True, temperature=0, max_output_tokens=1500)
    running = poll(client, job.id, lambda r: len(r.output_text) > 10 or r.status != "in_progress")
    assert running.status == "in_progress", (running.status, running.output_text)
    cancelled = client.responses.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert cancelled.output_text.startswith(running.output_text)
