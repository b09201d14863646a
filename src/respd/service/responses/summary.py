"""The model's summary of a conversation: what a compaction item carries.

The conversation goes to the model as a plain transcript (its latest turns kept when it
is too long), greedy and bounded, so a summary always ends; one cut at its budget is
still a summary.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import ChatMessage, Engine, SamplingParams
from respd.protocol.errors import ContextLengthExceeded, InvalidRequest, ServerError
from respd.service.generation import core
from respd.service.generation.core import GenerationSpec
from respd.service.generation.output import Finished, ReasoningDelta, TextDelta, Usage
from respd.service.ids import new_id
from respd.service.responses.events import ResponseEventMachine
from respd.service.sealing import Sealer

SUMMARY_TOKENS = 400  # the summary's budget
_PER_TURN_CHARS = 1500  # a turn longer than this is cut in the transcript
_CHARS_PER_TOKEN = 2.5  # a cautious ratio for code and JSON; the count is checked anyway
_SUMMARIZE = (
    "You compact a conversation between a user and an assistant so that it can continue "
    "without it. Write a short summary of it: the user's goal, what was done (commands "
    "run, files changed, results), what is still open, and any facts needed to go on. "
    "Write only the summary."
)


@dataclass
class Summary:
    text: str
    usage: Usage


class SummaryFailed(ServerError):
    """The model failed (or was stopped) while writing the summary."""

    def __init__(self) -> None:
        super().__init__("The model failed while compacting this conversation.")


def _turn(m: ChatMessage) -> str:
    text = m.text
    if m.tool_calls:
        text += "".join(f"\n[calls {c.name} with {c.arguments}]" for c in m.tool_calls)
    if len(text) > _PER_TURN_CHARS:
        text = text[:_PER_TURN_CHARS] + " [...]"
    label = f"tool {m.name} returned" if m.role == "tool" else m.role
    return f"{label}: {text.strip()}"


def transcript(messages: list[ChatMessage], max_chars: int) -> str:
    """The conversation as plain text, its latest turns first to be kept."""
    turns: list[str] = []
    size = 0
    for m in reversed(messages):
        turn = _turn(m)
        if size + len(turn) > max_chars and turns:
            break
        turns.append(turn[-max_chars:])
        size += len(turn) + 1
    return "\n".join(reversed(turns))


async def summarize(
    engine: Engine,
    messages: list[ChatMessage],
    runs: core.ActiveRuns | None,
    *,
    cache_key: str | None = None,
) -> Summary:
    """The model's summary of `messages`: as much of their end as the context holds."""
    async with aclosing(summarizing(engine, messages, runs, cache_key=cache_key)) as steps:
        async for step in steps:
            if step is not None:
                return step
    raise SummaryFailed  # `summarizing` ends with its summary or raises


async def summarizing(
    engine: Engine,
    messages: list[ChatMessage],
    runs: core.ActiveRuns | None,
    *,
    cache_key: str | None = None,
) -> AsyncGenerator[Summary | None, None]:
    """`summarize` step by step: None each time new summary text is sampled (progress
    for whoever waits), then the `Summary`."""
    budget = int((engine.context_window - SUMMARY_TOKENS - 200) * _CHARS_PER_TOKEN)
    for _ in range(4):
        spec = GenerationSpec(
            messages=[
                ChatMessage("system", _SUMMARIZE),
                ChatMessage("user", transcript(messages, max(budget, 400))),
            ],
            sampling=SamplingParams(temperature=0, max_tokens=SUMMARY_TOKENS),
            reasoning_effort="none",
            cache_key=cache_key,
        )
        try:
            prepared = await core.prepare(engine, spec)
        except ContextLengthExceeded:
            if budget <= 400:
                raise
            budget //= 2
            continue
        text: list[str] = []
        thoughts: list[str] = []  # a model that thinks anyway may leave its summary there
        finished: Finished | None = None
        async with aclosing(core.run(prepared, runs)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    text.append(event.text)
                    yield None
                elif isinstance(event, ReasoningDelta):
                    thoughts.append(event.text)
                    yield None
                elif isinstance(event, Finished):
                    finished = event
        if finished is None or finished.reason not in ("stop", "length"):
            raise SummaryFailed
        yield Summary(("".join(text) or "".join(thoughts)).strip(), finished.usage)
        return
    raise ContextLengthExceeded("The history is too long to compact on this model.")


def compaction_item(sealer: Sealer, summary: str, item_id: str | None = None) -> dict[str, Any]:
    """The item that stands for the turns `summary` replaced, its text sealed."""
    return {
        "type": "compaction",
        "id": item_id or new_id("cmp"),
        "encrypted_content": sealer.seal("compaction", {"summary": summary}),
    }


def split_for_compaction(
    messages: list[ChatMessage],
) -> tuple[list[ChatMessage], list[ChatMessage], list[ChatMessage]] | None:
    """`messages` as automatic compaction splits them: the leading system turns (kept),
    the turns a summary replaces, and the last user turn with what follows it (kept).
    None when nothing comes before the last user turn."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user <= lead:
        return None
    return messages[:lead], messages[lead:last_user], messages[last_user:]


# Without `compact_threshold`, compaction starts at this share of the context window.
DEFAULT_THRESHOLD_SHARE = 0.8


def compaction_threshold(management: Any, context_window: int) -> int | None:
    """The prompt size past which `context_management` asks for compaction (None: it
    does not); a malformed entry is a 400 naming it."""
    if management is None:
        return None
    if not isinstance(management, list):
        raise InvalidRequest(
            "Invalid type for 'context_management': expected an array.",
            param="context_management",
            code="invalid_type",
        )
    threshold: int | None = None
    for i, entry in enumerate(management):
        param = f"context_management[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            raise InvalidRequest(
                f"Invalid value for '{param}.type': only 'compaction' is supported.",
                param=f"{param}.type",
                code="invalid_value",
            )
        value = entry.get("compact_threshold")
        if value is None:
            value = int(context_window * DEFAULT_THRESHOLD_SHARE)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(
                f"Invalid '{param}.compact_threshold': expected a positive integer.",
                param=f"{param}.compact_threshold",
                code="invalid_value",
            )
        threshold = value if threshold is None else min(threshold, value)
    return threshold


# `response.compaction.compacting` goes out when summary text is first sampled, then at most
# once per this many seconds (OpenAI's pace).
COMPACTING_EVERY_SECS = 30.0


@dataclass
class Compacted:
    """Where `stream_compaction` leaves its summary."""

    summary: Summary | None = None


async def stream_compaction(
    machine: ResponseEventMachine,
    engine: Engine,
    messages: list[ChatMessage],
    runs: core.ActiveRuns | None,
    sealer: Sealer,
    result: Compacted,
    *,
    cache_key: str | None = None,
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """A compaction item's events as its summary of `messages` is made: added, then
    `response.compaction.compacting` as summary text is sampled, then done with its sealed
    content; the summary lands in `result`. A failure takes the item back and raises."""
    index, events = machine.add_item(
        {"type": "compaction", "id": new_id("cmp"), "encrypted_content": ""}
    )
    for event in events:
        yield event
    last: float | None = None
    try:
        async with aclosing(summarizing(engine, messages, runs, cache_key=cache_key)) as steps:
            async for step in steps:
                if step is not None:
                    result.summary = step
                elif last is None or time.monotonic() - last >= COMPACTING_EVERY_SECS:
                    last = time.monotonic()
                    yield machine.compacting(index)
    except (SummaryFailed, ContextLengthExceeded):
        machine.drop_item(index)
        raise
    assert result.summary is not None
    item = compaction_item(sealer, result.summary.text, machine.output[index]["id"])
    for event in machine.item_done(index, item):
        yield event
