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
from typing import Any, Literal

from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, ConfigDict

from respd.engines.base import ChatMessage, Engine
from respd.protocol.errors import ContextLengthExceeded, InvalidRequest, MissingParameter
from respd.protocol.responses import CreateResponseRequest
from respd.service.ids import new_id
from respd.service.responses.events import ResponseEventMachine, usage_json
from respd.service.responses.history import resolve_history
from respd.service.responses.items import normalize_items
from respd.service.responses.runner import (
    TERMINAL_EVENTS,
    ResponseRunner,
    Turn,
    build_echo,
    request_sampling,
)
from respd.service.responses.summary import (
    Compacted,
    SummaryFailed,
    compaction_item,
    stream_compaction,
    summarize,
)
from respd.service.responses.translate import check_item_shapes
from respd.store.base import JSON

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
class CompactionRun:
    turn: Turn
    machine: ResponseEventMachine
    events: AsyncGenerator[ResponseStreamEvent, None]


class CompactRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    # The summary's generation keeps its KV under this key, as a create's would.
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    image: dict[str, Any] | None = None


def retained_messages(items: list[JSON]) -> list[JSON]:
    """The user messages a compacted history keeps, in order, ahead of its summary."""
    return [i for i in items if i.get("type") == "message" and i.get("role") == "user"]


class Compactor:
    def __init__(self, service: ResponseRunner) -> None:
        self.service = service

    async def compact(self, body: CompactRequest, owner: str) -> dict[str, Any]:
        """`POST /v1/responses/compact`: every user message of the history, then one
        compaction item for the whole of it."""
        service = self.service
        if not body.model:
            raise MissingParameter("model")
        engine = await service.models.ready(body.model)
        check_item_shapes(body.input)
        history = await resolve_history(
            service.store, owner, previous_response_id=body.previous_response_id, conversation=None
        )
        messages = await service.conversation(engine, owner, history, body.input, body.instructions)
        summary = await summarize(engine, messages, service.runs, cache_key=body.prompt_cache_key)
        kept = retained_messages([*history.items, *normalize_items(body.input)])
        return {
            "id": new_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*kept, compaction_item(service.sealer, summary.text)],
            "usage": usage_json(summary.usage),
            "safety_identifier": body.safety_identifier,
            "service_tier": "default",
        }

    async def start(self, req: CreateResponseRequest, owner: str) -> CompactionRun:
        """A compaction turn (`compaction_turn(req.input)`): checked now, so a bad request
        is an error before any event; the events come as the summary is made."""
        service = self.service
        if req.background:
            raise InvalidRequest(
                "A compaction turn cannot run in the background.",
                param="background",
                code="invalid_value",
            )
        engine = await service.checked_engine(req)
        sampling = request_sampling(req)
        items = req.input[:-1] if isinstance(req.input, list) else req.input
        history, messages = await service.context(engine, req, owner, items)
        turn = Turn(req, owner, normalize_items(req.input), history)
        machine = ResponseEventMachine(build_echo(req, sampling, engine, history.conversation_id))
        return CompactionRun(turn, machine, self._events(turn, machine, engine, messages))

    async def _events(
        self,
        turn: Turn,
        machine: ResponseEventMachine,
        engine: Engine,
        messages: list[ChatMessage],
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        for event in machine.start():
            yield event
        result = Compacted()
        steps = stream_compaction(
            machine,
            engine,
            messages,
            self.service.runs,
            self.service.sealer,
            result,
            cache_key=turn.request.prompt_cache_key,
        )
        try:
            async with aclosing(steps):
                async for event in steps:
                    yield event
        except (SummaryFailed, ContextLengthExceeded) as exc:
            events = machine.fail(exc.message)
        else:
            assert result.summary is not None
            events = machine.finish(usage=result.summary.usage)
        for event in events:
            if event.type in TERMINAL_EVENTS:
                await self.service.persist(turn, machine)
            yield event
