"""Reasoning end to end: the default model served with a Qwen3-style template whose
generation prompt opens a `<think>` block (tests/templates/think.jinja).

The 135M model does not reliably write `</think>` itself, so the tests that need thinking
*and* an answer use structured output: on a primed thinking template the grammar first
admits bounded thinking (128 characters at effort "minimal"), then `</think>`, then the JSON
answer. That structure holds on every seed and sampler state, so those tests are
deterministic; everything else asserts only what holds whatever the model writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from tests.support.sdk_types import strict_compacted, strict_event, strict_response
from tests.support.servers import MODEL_ID, TEMPLATES, RespdServer, start_server

ANSWER = {
    "type": "json_schema",
    "name": "answer",
    "schema": {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 24}},
        "required": ["answer"],
        "additionalProperties": False,
    },
    "strict": True,
}
CONSTRAINED: dict[str, Any] = {
    "model": MODEL_ID,
    "input": "What is 2+2?",
    "temperature": 0,
    "max_output_tokens": 120,
    "reasoning": {"effort": "minimal"},
    "text": {"format": ANSWER},
}


STATE_KEY = "a key every replica shares"
THINK_ARGS = ("--chat-template", str(TEMPLATES / "think.jinja"))


@pytest.fixture(scope="module")
def think_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    srv = start_server(
        tmp_path_factory.mktemp("respd-think"),
        *THINK_ARGS,
        "--state-key",
        STATE_KEY,
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture()
def tclient(think_server: RespdServer) -> openai.OpenAI:
    return think_server.client(timeout=120)


def _wire(r: Response) -> Response:
    return strict_response(r.model_dump(mode="json", exclude_unset=True, by_alias=True))


def _reasoning_text(r: Response) -> str:
    items = [o for o in r.output if o.type == "reasoning"]
    assert len(items) == 1 and r.output[0] is items[0], "one reasoning item, ahead of the rest"
    item = items[0]
    assert item.id.startswith("rs_") and item.summary == []
    assert item.content and [c.type for c in item.content] == ["reasoning_text"]
    return item.content[0].text


def _tokens(client: openai.OpenAI, **body: Any) -> int:
    return int(client.responses.input_tokens.count(model=MODEL_ID, **body).input_tokens)


def test_stream_yields_reasoning_then_text(tclient: openai.OpenAI) -> None:
    reasoning_deltas: list[str] = []
    text_deltas: list[str] = []
    types: list[str] = []
    with tclient.responses.stream(**CONSTRAINED) as stream:
        for event in stream:
            strict_event(event.to_dict())
            types.append(event.type)
            if event.type == "response.reasoning_text.delta":
                reasoning_deltas.append(event.delta)
            elif event.type == "response.output_text.delta":
                text_deltas.append(event.delta)
        final = stream.get_final_response()
    final = _wire(final)
    assert final.status == "completed"
    assert [o.type for o in final.output] == ["reasoning", "message"]
    thinking = _reasoning_text(final)
    assert thinking and thinking == "".join(reasoning_deltas)
    assert len(thinking) <= 128  # effort "minimal" bounds constrained thinking
    assert final.output_text == "".join(text_deltas)
    assert set(json.loads(final.output_text)) == {"answer"}  # the answer is the JSON alone
    assert "</think>" not in final.output_text and thinking not in final.output_text
    # Order: the whole reasoning item before the message item opens.
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    assert types.index("response.output_item.done") < types.index("response.output_text.delta")
    usage = final.usage
    assert usage is not None
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens
    assert final.reasoning and final.reasoning.effort == "minimal"  # echoed unchanged


def test_free_generation_starts_inside_the_primed_block(tclient: openai.OpenAI) -> None:
    """No grammar: the prompt opened the block, so whatever the model writes first is
    reasoning, streamed as reasoning_text and never as output_text."""
    stream = tclient.responses.create(
        model=MODEL_ID, input="Say hello.", temperature=0, max_output_tokens=12, stream=True
    )
    events = [strict_event(e.to_dict()) for e in stream]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "reasoning"
    assert deltas and "".join(deltas) == _reasoning_text(final)
    rs_id = final.output[0].id
    assert all(e.item_id == rs_id for e in events if e.type == "response.reasoning_text.delta")
    text_events = [e for e in events if e.type == "response.output_text.delta"]
    assert all(e.item_id != rs_id for e in text_events)  # no output_text carries reasoning
    assert "".join(e.delta for e in text_events) == final.output_text
    assert final.usage.output_tokens_details.reasoning_tokens <= final.usage.output_tokens


def test_budget_spent_while_thinking_is_incomplete_with_only_reasoning(
    tclient: openai.OpenAI,
) -> None:
    r = _wire(
        tclient.responses.create(
            model=MODEL_ID,
            input="Explain photosynthesis in detail.",
            temperature=0,
            max_output_tokens=5,
        )
    )
    assert r.status == "incomplete"
    assert r.incomplete_details and r.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.status) for o in r.output] == [("reasoning", "incomplete")]
    assert _reasoning_text(r) and r.output_text == ""
    assert r.usage and r.usage.output_tokens == 5
    assert r.usage.output_tokens_details.reasoning_tokens == 5


def test_effort_none_renders_without_the_think_block(tclient: openai.OpenAI) -> None:
    body = {"input": "Say hello."}
    thinking = _tokens(tclient, **body)
    off = _tokens(tclient, **body, reasoning={"effort": "none"})
    # The generation prompt lost exactly its "<think>\n" (4 tokens in SmolLM2's vocabulary).
    assert thinking - off == 4
    with pytest.raises(openai.BadRequestError) as refused:  # OpenAI's values only
        _tokens(tclient, **body, reasoning={"effort": " Disabled "})
    assert refused.value.param == "reasoning.effort"
    assert _tokens(tclient, **body, reasoning={"effort": "high"}) == thinking
    r = _wire(
        tclient.responses.create(
            model=MODEL_ID,
            input="Say hello.",
            temperature=0,
            max_output_tokens=12,
            reasoning={"effort": "none"},
        )
    )
    assert r.usage and r.usage.input_tokens == off
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.reasoning and r.reasoning.effort == "none"


def test_reasoning_input_items_reach_the_next_assistant_turn(tclient: openai.OpenAI) -> None:
    thought = "The user wants a greeting, so greet back briefly."
    user = {"role": "user", "content": "Hi!"}
    assistant = {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}
    follow = {"role": "user", "content": "And again?"}
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": thought}],
    }
    without = _tokens(tclient, input=[user, assistant, follow])
    with_item = _tokens(tclient, input=[user, reasoning, assistant, follow])
    # "<think>\n" + thought + "\n</think>\n\n" rendered into the assistant turn
    assert with_item - without > len(thought.split())
    # With no assistant turn after it, a reasoning item is dropped from the prompt.
    assert _tokens(tclient, input=[user, assistant, reasoning, follow]) == without
    r = tclient.responses.create(
        model=MODEL_ID, input=[user, reasoning, assistant, follow], max_output_tokens=4
    )
    assert r.usage and r.usage.input_tokens == with_item
    items = tclient.responses.input_items.list(r.id, order="asc").data
    assert [i.type for i in items] == ["message", "reasoning", "message", "message"]
    assert items[1].id.startswith("rs_")


def test_non_streaming_reasoning_is_stored_and_replayed(tclient: openai.OpenAI) -> None:
    first = _wire(tclient.responses.create(**CONSTRAINED))
    assert first.status == "completed"
    assert [o.type for o in first.output] == ["reasoning", "message"]
    assert _reasoning_text(first) and set(json.loads(first.output_text)) == {"answer"}
    usage = first.usage
    assert usage and 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens
    assert _wire(tclient.responses.retrieve(first.id)).output == first.output
    # previous_response_id replays the stored reasoning item into the assistant turn
    thought, answer = _reasoning_text(first), first.output_text
    chained = _tokens(tclient, previous_response_id=first.id, input="Thanks!")
    user = {"role": "user", "content": CONSTRAINED["input"]}
    assistant = {"role": "assistant", "content": [{"type": "output_text", "text": answer}]}
    follow = {"role": "user", "content": "Thanks!"}
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": thought}],
    }
    assert chained == _tokens(tclient, input=[user, reasoning, assistant, follow])
    assert chained > _tokens(tclient, input=[user, assistant, follow])


def test_chat_reasoning_content(tclient: openai.OpenAI) -> None:
    body: dict[str, Any] = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "temperature": 0,
        "max_tokens": 120,
        "reasoning_effort": "minimal",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER["schema"], "strict": True},
        },
    }
    c = tclient.chat.completions.create(**body)
    msg = c.choices[0].message
    thinking = (msg.model_extra or {}).get("reasoning_content")
    assert isinstance(thinking, str) and thinking and len(thinking) <= 128
    assert set(json.loads(msg.content or "")) == {"answer"}
    assert c.usage and c.usage.completion_tokens_details
    assert 0 < (c.usage.completion_tokens_details.reasoning_tokens or 0) < c.usage.completion_tokens

    stream = tclient.chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True}
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert not (extra.get("reasoning_content") and choice.delta.content)
            reasoning += extra.get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert reasoning and len(reasoning) <= 128 and "</think>" not in content
    assert set(json.loads(content)) == {"answer"}
    assert usage and usage.completion_tokens_details
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens

    off = tclient.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Say hello."}],
        temperature=0,
        max_tokens=8,
        reasoning_effort="none",
    )
    on = tclient.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}], max_tokens=1
    )
    assert off.usage and on.usage and on.usage.prompt_tokens - off.usage.prompt_tokens == 4
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_chat_assistant_reasoning_content_reaches_the_template(tclient: openai.OpenAI) -> None:
    def prompt_tokens(assistant: dict[str, Any]) -> int:
        c = tclient.chat.completions.create(
            model=MODEL_ID,
            messages=[
                {"role": "user", "content": "Hi"},
                assistant,
                {"role": "user", "content": "Again"},
            ],
            max_tokens=1,
        )
        assert c.usage
        return c.usage.prompt_tokens

    plain = prompt_tokens({"role": "assistant", "content": "Hello."})
    thought = prompt_tokens(
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet them back."}
    )
    assert thought > plain


def test_templates_without_markers_are_not_split(client: openai.OpenAI) -> None:
    """SmolLM2's own template has no thinking markers: its output is never split."""
    r = client.responses.create(
        model=MODEL_ID, input="Write <think> then stop.", temperature=0, max_output_tokens=4
    )
    assert [o.type for o in r.output] == ["message"]
    assert r.usage and r.usage.output_tokens_details.reasoning_tokens == 0


def test_conversation_items_replay_reasoning(tclient: openai.OpenAI) -> None:
    user = {"type": "message", "role": "user", "content": "Hi!"}
    reasoning = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "A greeting; answer in kind."}],
    }
    assistant = {"type": "message", "role": "assistant", "content": "Hello."}
    conv = tclient.conversations.create(items=[user, reasoning, assistant])  # type: ignore[list-item]
    items = tclient.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in items] == ["message", "reasoning", "message"]
    assert items[1].id.startswith("rs_")
    follow = {"role": "user", "content": "Again?"}
    replayed = _tokens(tclient, conversation=conv.id, input=[follow])
    assert replayed == _tokens(tclient, input=[user, reasoning, assistant, follow])
    assert replayed > _tokens(tclient, input=[user, assistant, follow])


def test_logprobs_follow_the_answer_behind_the_thinking(tclient: openai.OpenAI) -> None:
    """Logprobs go with message text only: the thinking's tokens have none, and the answer's
    tokens (all but possibly one that straddles `</think>`) spell the answer's end."""
    streamed: list[Any] = []
    with tclient.responses.stream(
        **CONSTRAINED, include=["message.output_text.logprobs"], top_logprobs=2
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                streamed += event.logprobs or []
        final = stream.get_final_response()
    message = final.output[-1]
    assert message.type == "message" and message.content[0].type == "output_text"
    logprobs = message.content[0].logprobs or []
    assert logprobs and [lp.token for lp in logprobs] == [lp.token for lp in streamed]
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in logprobs)
    joined = b"".join(bytes(lp.bytes or []) for lp in logprobs)
    text = final.output_text.encode()
    assert text.endswith(joined) and len(text) - len(joined) <= 8, (text, joined)
    assert final.usage is not None
    # No entry for any thinking token.
    reasoning = final.usage.output_tokens_details.reasoning_tokens
    assert reasoning > 0 and len(logprobs) <= final.usage.output_tokens - reasoning


def test_encrypted_reasoning_round_trips_to_another_process_with_the_key(
    tclient: openai.OpenAI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A `store: false` client keeps only the sealed reasoning; a second respd process
    given the same key restores it into the prompt, and refuses it altered."""
    first = _wire(
        tclient.responses.create(
            **CONSTRAINED, store=False, include=["reasoning.encrypted_content"]
        )
    )
    thought, item = _reasoning_text(first), first.output[0]
    assert item.type == "reasoning" and item.encrypted_content
    assert thought not in item.encrypted_content
    user = {"role": "user", "content": CONSTRAINED["input"]}
    assistant = {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]}
    follow = {"role": "user", "content": "Thanks!"}
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": item.encrypted_content}
    plain = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": thought}],
    }
    other = start_server(
        tmp_path_factory.mktemp("respd-think-2"),
        *THINK_ARGS,
        "--state-key",
        STATE_KEY,
        preset="small",
    )
    stranger = start_server(tmp_path_factory.mktemp("respd-think-3"), *THINK_ARGS, preset="small")
    try:
        oc = other.client(timeout=120)
        restored = _tokens(oc, input=[user, sealed, assistant, follow])
        assert restored == _tokens(oc, input=[user, plain, assistant, follow])
        assert restored > _tokens(oc, input=[user, assistant, follow])
        r = oc.responses.create(
            model=MODEL_ID, input=[user, sealed, assistant, follow], max_output_tokens=4
        )
        assert r.usage is not None and r.usage.input_tokens == restored
        token = item.encrypted_content
        tampered = {
            **sealed,
            "encrypted_content": token[:30] + ("B" if token[30] == "A" else "A") + token[31:],
        }
        for client, bad in ((oc, tampered), (stranger.client(), sealed)):
            with pytest.raises(openai.BadRequestError) as exc:
                client.responses.create(model=MODEL_ID, input=[user, bad, assistant, follow])
            assert exc.value.code == "invalid_encrypted_content"
            assert exc.value.param == "input[1].encrypted_content"
    finally:
        for srv in (other, stranger):
            srv.stop()
            srv.assert_no_5xx()


def test_compaction_stands_for_the_history_it_summarised(tclient: openai.OpenAI) -> None:
    first = tclient.responses.create(
        model=MODEL_ID,
        input="My name is Ada and I like tea.",
        max_output_tokens=30,
        reasoning={"effort": "none"},
    )
    raw = tclient.responses.with_raw_response.compact(
        model=MODEL_ID,
        previous_response_id=first.id,
        input=[{"role": "user", "content": "Noted?"}],
        prompt_cache_key="ada",
    )
    compacted, kept = strict_compacted(json.loads(raw.text))
    assert compacted.object == "response.compaction"
    assert [m.role for m in kept] == ["user", "user"]
    (item,) = compacted.output
    assert item.type == "compaction" and item.encrypted_content
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0
    history = [item.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    without = _tokens(tclient, input=[{"role": "user", "content": "Go on."}])
    assert _tokens(tclient, input=history) > without  # the summary is in the prompt
    r = tclient.responses.create(model=MODEL_ID, input=history, max_output_tokens=4)
    assert r.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as exc:
        tclient.responses.compact(model=MODEL_ID, input=[{"type": "bogus"}])  # type: ignore[list-item]
    assert exc.value.param == "input[0].type"


def test_reasoning_summary_is_streamed_as_summary_parts(tclient: openai.OpenAI) -> None:
    body = {**CONSTRAINED, "reasoning": {"effort": "minimal", "summary": "auto"}}
    events = list(tclient.responses.create(**body, stream=True))
    for e in events:
        strict_event(e.to_dict())
    types = [e.type for e in events]
    assert "response.reasoning_summary_text.done" in types
    final = _wire(events[-1].response)  # type: ignore[union-attr]
    thought = _reasoning_text_of(final)
    item = final.output[0]
    assert item.type == "reasoning" and [s.text for s in item.summary] == [thought.strip()]


def _reasoning_text_of(r: Response) -> str:
    item = r.output[0]
    assert item.type == "reasoning" and item.content
    return item.content[0].text
