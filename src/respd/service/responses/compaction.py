"""`POST /v1/responses/compact`: a long history made short enough to go on with.

The model summarises the history (the request's items after the chain it continues); the
result is one `compaction` item that carries the summary, sealed (`sealing.py`). Given
back as input, that item stands for every turn it replaced: `translate.py` opens it into
a summary turn of the prompt.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from respd.engines.base import ChatMessage
from respd.protocol.errors import ContextLengthExceeded, MissingParameter
from respd.protocol.responses import CreateResponseRequest, ReasoningConfig
from respd.service.ids import new_id
from respd.service.responses.events import usage_json
from respd.service.responses.history import resolve_history
from respd.service.responses.service import ResponsesService
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
        summary, usage = await self._summarize(body.model, engine.context_window, messages, owner)
        compaction = {
            "type": "compaction",
            "id": new_id("cmp"),
            "encrypted_content": service.sealer.seal("compaction", {"summary": summary}),
        }
        return {
            "id": new_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [compaction],
            "usage": usage,
        }

    async def _summarize(
        self, model: str, context_window: int, messages: list[ChatMessage], owner: str
    ) -> tuple[str, dict[str, Any]]:
        """The model's summary of `messages`: as much of their end as the context holds."""
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
            async for _event in self.service.respond(prepared, machine):
                pass
            response = machine.snapshot()
            usage = usage_json(machine.usage) if machine.usage else {}
            # A model that thinks anyway may leave its summary in its reasoning.
            thoughts = [
                part.text
                for item in response.output
                if item.type == "reasoning"
                for part in item.content or []
            ]
            return (response.output_text or "\n".join(thoughts)).strip(), usage
        raise ContextLengthExceeded("The history is too long to compact on this model.")
