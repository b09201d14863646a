"""`ignore_eos` and `min_tokens` (the extensions load generators send) on both APIs, with
the real model through the SDK's `extra_body`: the model that would end its answer early
keeps going to exactly `max_tokens`, or to at least `min_tokens`; stop sequences still
end it."""

from __future__ import annotations

import openai
from openai.types.responses import Response

from tests.support.servers import MODEL_ID

SAY_HI = [{"role": "user", "content": "Say hi."}]


def test_chat_ignore_eos_and_min_tokens(client: openai.OpenAI) -> None:
    def chat(**extra: object) -> tuple[str | None, str, int]:
        out = client.chat.completions.create(
            model=MODEL_ID,
            messages=SAY_HI,  # type: ignore[arg-type]
            max_tokens=40,
            temperature=0,
            extra_body=extra,
        )
        assert out.usage is not None
        choice = out.choices[0]
        return choice.finish_reason, choice.message.content or "", out.usage.completion_tokens

    # Left alone, the model answers in fewer tokens, so the runs below prove something.
    finish, _, plain = chat()
    assert finish == "stop" and plain < 30, (finish, plain)
    finish, _, n = chat(ignore_eos=True)
    assert (finish, n) == ("length", 40)
    finish, _, n = chat(min_tokens=30)
    assert n >= 30, n
    assert finish in ("stop", "length")
    # A stop sequence still ends the output (the greedy answer opens with "Hello there!").
    finish, text, n = chat(ignore_eos=True, stop=["!"])
    assert finish == "stop" and "!" not in text and n < 40, (finish, text, n)


def test_responses_ignore_eos_and_min_tokens(client: openai.OpenAI) -> None:
    def create(**extra: object) -> Response:
        return client.responses.create(
            model=MODEL_ID,
            input="Say hi.",
            max_output_tokens=40,
            temperature=0,
            store=False,
            extra_body=extra,
        )

    plain = create()
    assert plain.status == "completed" and plain.usage is not None
    assert plain.usage.output_tokens < 30, plain.usage
    forced = create(ignore_eos=True)
    assert forced.status == "incomplete" and forced.incomplete_details is not None
    assert forced.incomplete_details.reason == "max_output_tokens"
    assert forced.usage is not None and forced.usage.output_tokens == 40
    assert forced.output_text.startswith(plain.output_text), (plain.output_text, forced)
    longer = create(min_tokens=30)
    assert longer.usage is not None and longer.usage.output_tokens >= 30, longer.usage


def test_responses_stream_with_ignore_eos_ends_incomplete(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL_ID,
            input="Say hi.",
            max_output_tokens=40,
            temperature=0,
            store=False,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    last = events[-1]
    assert last.type == "response.incomplete", last.type
    assert last.response.usage is not None and last.response.usage.output_tokens == 40
