"""The message and reasoning items a response writes as text streams in.

Each is one content part that grows by deltas; a reasoning item may carry a summary, which
the model did not write, so it is made from the reasoning itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    ResponseOutputMessage,
    ResponseOutputTextAnnotationAddedEvent,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
CONCISE_CHARS = 280


def summarize_reasoning(text: str, mode: str) -> str:
    """The summary of a reasoning item. The model wrote no summary of its own, so
    `detailed` (and `auto`) is the reasoning itself, `concise` its opening sentences up to
    about 280 characters."""
    text = text.strip()
    if mode != "concise" or len(text) <= CONCISE_CHARS:
        return text
    out = ""
    for sentence in _SENTENCE_END.split(text):
        if out and len(out) + len(sentence) + 1 > CONCISE_CHARS:
            break
        out = f"{out} {sentence}".strip()
    return out if len(out) <= CONCISE_CHARS else out[:CONCISE_CHARS].rstrip() + "…"


TextKind = Literal["message", "reasoning"]


@dataclass
class OpenText:
    """A message or reasoning item being written: one content part that grows by deltas."""

    kind: TextKind
    id: str
    output_index: int
    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # message text only
    annotations: list[dict[str, Any]] = field(default_factory=list)  # its citations

    def part(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {
            "type": "output_text",
            "text": self.text,
            "annotations": list(self.annotations),
            "logprobs": list(self.logprobs),
        }

    def item(self, status: str, *, empty: bool = False) -> dict[str, Any]:
        """The item; `empty`: as `output_item.added` announces it, before any part."""
        content = [] if empty else [self.part()]
        if self.kind == "reasoning":
            return {
                "id": self.id,
                "type": "reasoning",
                "summary": [],
                "content": content,
                "status": status,
            }
        return {
            "id": self.id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }


# Per kind: the event type prefix, the delta and done event classes, the finished item's class.
TEXT_EVENTS: dict[TextKind, tuple[str, type[BaseModel], type[BaseModel], type[BaseModel]]] = {
    "message": (
        "response.output_text",
        ResponseTextDeltaEvent,
        ResponseTextDoneEvent,
        ResponseOutputMessage,
    ),
    "reasoning": (
        "response.reasoning_text",
        ResponseReasoningTextDeltaEvent,
        ResponseReasoningTextDoneEvent,
        ResponseReasoningItem,
    ),
}
ID_PREFIX: dict[TextKind, str] = {"message": "msg", "reasoning": "rs"}


Event = tuple[type[BaseModel], dict[str, Any]]


def summary_events(t: OpenText, summary: str) -> list[Event]:
    """The events of a reasoning item's summary, sent whole once the reasoning is done."""
    part = {"type": "summary_text", "text": summary}
    where = {"item_id": t.id, "output_index": t.output_index, "summary_index": 0}
    prefix = "response.reasoning_summary"
    return [
        (
            ResponseReasoningSummaryPartAddedEvent,
            {"type": f"{prefix}_part.added", "part": {**part, "text": ""}, **where},
        ),
        (
            ResponseReasoningSummaryTextDeltaEvent,
            {"type": f"{prefix}_text.delta", "delta": summary, **where},
        ),
        (
            ResponseReasoningSummaryTextDoneEvent,
            {"type": f"{prefix}_text.done", "text": summary, **where},
        ),
        (
            ResponseReasoningSummaryPartDoneEvent,
            {"type": f"{prefix}_part.done", "part": part, **where},
        ),
    ]


def citation_events(t: OpenText) -> list[Event]:
    """One `annotation.added` event per citation of a message's text."""
    where = {"item_id": t.id, "output_index": t.output_index, "content_index": 0}
    return [
        (
            ResponseOutputTextAnnotationAddedEvent,
            {
                "type": "response.output_text.annotation.added",
                "annotation_index": i,
                "annotation": annotation,
                **where,
            },
        )
        for i, annotation in enumerate(t.annotations)
    ]
