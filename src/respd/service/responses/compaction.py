"""Compaction: a long history made short enough to go on with.

Two ways in: `POST /v1/responses/compact`, and a `POST /v1/responses` whose input ends
with a `compaction_trigger` item (a response whose one output item is the compaction, with
the usual stream events; Codex compacts this way). The model summarises the history (the
request's items after the chain it continues); the result is one `compaction` item that
carries the summary, sealed (`sealing.py`). Given back as input, that item stands for
every turn it replaced: `translate.py` opens it into a summary turn of the prompt.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, ConfigDict

from respd.engines.base import ChatMessage
from respd.protocol.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    MissingParameter,
    ServerError,
)
from respd.protocol.responses import CreateResponseRequest, ReasoningConfig, check_include
from respd.service.generation.output import Usage
from respd.service.ids import new_id
from respd.service.metadata import check_metadata
from respd.service.responses.events import ResponseEventMachine, usage_json
from respd.service.responses.history import resolve_history
from respd.service.responses.items import normalize_items
from respd.service.responses.service import (
    TERMINAL_EVENTS,
    ResponsesService,
    Turn,
    build_echo,
    request_sampling,
)
from respd.service.responses.translate import check_item_shapes

SUMMARY_TOKENS = 400  # the summary's budget
_PER_TURN_CHARS = 1500  # a turn longer than this is cut in the transcript
_CHARS_PER_TOKEN = 2.5  # a cautious ratio for code and JSON; the count is checked anyway
_SUMMARIZE = (
    "You compact a conversation between a user and an assistant so that it can continue "
    "without it. Write a short summary of it: the user's goal, what was done (commands "
    "run, files changed, results), what is still open, and any facts needed to go on. "
    "Write only the summary."
)


TRIGGER = "compaction_trigger"


def compaction_turn(items: Any) -> bool:
    """Whether a create request's input ends with a `compaction_trigger`; one anywhere
    else is a 400 (it must be the final item)."""
    if not isinstance(items, list):
        return False
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == TRIGGER and i != len(items) - 1:
            raise InvalidRequest(
                f"Invalid 'input[{i}]': a compaction_trigger must be the final input item.",
                param=f"input[{i}]",
                code="invalid_value",
            )
    return bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == TRIGGER


@dataclass
class Summary:
    text: str
    usage: Usage


@dataclass
class CompactionRun:
    turn: Turn
    machine: ResponseEventMachine
    events: AsyncGenerator[ResponseStreamEvent, None]


class SummaryFailed(ServerError):
    """The model failed while writing the summary."""

    def __init__(self) -> None:
        super().__init__("The model failed while compacting this conversation.")


class CompactRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None


def _turn(m: ChatMessage) -> str:
    text = m.content
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


class Compactor:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    def _item(self, summary: str) -> dict[str, Any]:
        return {
            "type": "compaction",
            "id": new_id("cmp"),
            "encrypted_content": self.service.sealer.seal("compaction", {"summary": summary}),
        }

    async def compact(self, body: CompactRequest, owner: str) -> dict[str, Any]:
        service = self.service
        if not body.model:
            raise MissingParameter("model")
        engine = service.models.get(body.model)
        check_item_shapes(body.input)
        history = await resolve_history(
            service.store, owner, previous_response_id=body.previous_response_id, conversation=None
        )
        messages = await service.conversation(engine, owner, history, body.input, body.instructions)
        summary = await self._summarize(body.model, engine.context_window, messages, owner)
        return {
            "id": new_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [self._item(summary.text)],
            "usage": usage_json(summary.usage),
        }

    async def start(self, req: CreateResponseRequest, owner: str) -> CompactionRun:
        """A compaction turn (`compaction_turn(req.input)`): checked now, so a bad request
        is an error before any event; the events come as the summary is made."""
        service = self.service
        service.limits.check(req.input, req.instructions, req.tools, items_param="input")
        if req.background:
            raise InvalidRequest(
                "A compaction turn cannot run in the background.",
                param="background",
                code="invalid_value",
            )
        engine = service.models.get(req.model)
        check_item_shapes(req.input)
        check_metadata(req.metadata)
        check_include(req.include or [])
        sampling = request_sampling(req, service.default_max_tokens)
        history = await resolve_history(
            service.store,
            owner,
            previous_response_id=req.previous_response_id,
            conversation=req.conversation,
        )
        items = req.input[:-1] if isinstance(req.input, list) else req.input
        messages = await service.conversation(engine, owner, history, items, req.instructions)
        turn = Turn(req, owner, normalize_items(req.input), history)
        machine = ResponseEventMachine(build_echo(req, sampling, engine, history.conversation_id))
        return CompactionRun(
            turn, machine, self._events(turn, machine, engine.context_window, messages)
        )

    async def _events(
        self,
        turn: Turn,
        machine: ResponseEventMachine,
        context_window: int,
        messages: list[ChatMessage],
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        for event in machine.start():
            yield event
        try:
            summary = await self._summarize(
                turn.request.model, context_window, messages, turn.owner
            )
        except SummaryFailed as exc:
            events = machine.fail(exc.message)
        else:
            events = machine.whole_item(self._item(summary.text))
            events += machine.finish(usage=summary.usage)
        for event in events:
            if event.type in TERMINAL_EVENTS:
                await self.service.persist(turn, machine)
            yield event

    async def _summarize(
        self, model: str, context_window: int, messages: list[ChatMessage], owner: str
    ) -> Summary:
        """The model's summary of `messages`: as much of their end as the context holds.
        A summary cut at its budget is still one."""
        budget = int((context_window - SUMMARY_TOKENS - 200) * _CHARS_PER_TOKEN)
        for _ in range(4):
            req = CreateResponseRequest(
                model=model,
                instructions=_SUMMARIZE,
                input=transcript(messages, max(budget, 400)),
                max_output_tokens=SUMMARY_TOKENS,
                temperature=0,
                store=False,
                reasoning=ReasoningConfig(effort="none"),
            )
            try:
                prepared = await self.service.prepare(req, owner)
            except ContextLengthExceeded:
                if budget <= 400:
                    raise
                budget //= 2
                continue
            machine = prepared.machine()
            async with aclosing(self.service.respond(prepared, machine)) as events:
                async for _event in events:
                    pass
            if machine.status == "failed":
                raise SummaryFailed
            response = machine.snapshot()
            # A model that thinks anyway may leave its summary in its reasoning.
            thoughts = [
                part.text
                for item in response.output
                if item.type == "reasoning"
                for part in item.content or []
            ]
            text = (response.output_text or "\n".join(thoughts)).strip()
            return Summary(text, machine.usage or Usage())
        raise ContextLengthExceeded("The history is too long to compact on this model.")
