"""The one event state machine of a response.

It emits every typed SSE event, numbered from 0, AND builds the final `Response`. Streaming
and non-streaming requests drive the same machine, so the ids, order and content a client
sees are identical whichever way it asked. Events and objects are the `openai` SDK's own
pydantic types, so a field we misspell fails here, not in a client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseQueuedEvent,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel

from respd.engines.base import TokenLogprob
from respd.service.ids import new_id
from respd.service.logprobs import LogprobAligner, logprob_json
from respd.service.reasoning import ReasoningDelta
from respd.service.tool_parsing import ArgumentsDelta, CallStarted, ParseEvent, TextDelta

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass
class _OpenMessage:
    id: str
    output_index: int
    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _OpenReasoning:
    id: str
    output_index: int
    text: str = ""

    def item(self, status: str, *, partial: bool = False) -> dict[str, Any]:
        content = [] if partial and not self.text else [_reasoning_part(self.text)]
        return {
            "id": self.id,
            "type": "reasoning",
            "summary": [],
            "content": content,
            "status": status,
        }


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


@dataclass
class _OpenCall:
    id: str
    call_id: str
    name: str
    output_index: int
    arguments: str = ""

    def item(self, status: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function_call",
            "status": status,
            "arguments": self.arguments,
            "call_id": self.call_id,
            "name": self.name,
        }


@dataclass
class ResponseEventMachine:
    """Drives one response from `created` to its terminal event.

    `echo` holds the request settings the Response object repeats (instructions, model,
    temperature, tools, ...); see `service/responses.py` for how it is built.
    """

    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None
    generated_tokens: int = 0  # tokens seen so far: the usage of a response cut short
    _seq: int = 0
    _message: _OpenMessage | None = None
    _call: _OpenCall | None = None
    _reasoning: _OpenReasoning | None = None
    _held_logprobs: list[dict[str, Any]] = field(default_factory=list)  # tokens with no text yet

    # -- snapshots ------------------------------------------------------------------------

    def snapshot(self) -> Response:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.incomplete_reason else None
            ),
            "output": self._output_so_far(),
            "usage": self.usage.as_dict() if self.usage else None,
        }
        body.update(self.echo)
        return Response.model_validate(body)

    def _output_so_far(self) -> list[dict[str, Any]]:
        """Output items, with the text of a message still being written (a live poll)."""
        output = list(self.output)
        msg = self._message
        if msg is not None:
            part = {
                "type": "output_text",
                "text": msg.text,
                "annotations": [],
                "logprobs": list(msg.logprobs),
            }
            output[msg.output_index] = {**output[msg.output_index], "content": [part]}
        rs = self._reasoning
        if rs is not None:  # thinking still being written
            output[rs.output_index] = rs.item("in_progress")
        return output

    def _event(self, cls: type[BaseModel], **fields: Any) -> ResponseStreamEvent:
        event = cls.model_validate({**fields, "sequence_number": self._seq})
        self._seq += 1
        return event  # type: ignore[return-value]

    # -- transitions ----------------------------------------------------------------------

    @property
    def sequence_number(self) -> int:
        """The number the next event will carry."""
        return self._seq

    def start(self) -> list[ResponseStreamEvent]:
        """`created` (+ `queued` for a background response, which starts out queued), then
        `in_progress`."""
        snap = self.snapshot()
        events = [self._event(ResponseCreatedEvent, type="response.created", response=snap)]
        if self.status == "queued":
            events.append(self._event(ResponseQueuedEvent, type="response.queued", response=snap))
            self.status = "in_progress"
            snap = self.snapshot()
        events.append(
            self._event(ResponseInProgressEvent, type="response.in_progress", response=snap)
        )
        return events

    def _open_message(self) -> list[ResponseStreamEvent]:
        msg = _OpenMessage(new_id("msg"), len(self.output))
        self._message = msg
        item = {
            "id": msg.id,
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.output.append(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=msg.output_index,
                item=item,
            ),
            self._event(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                item_id=msg.id,
                output_index=msg.output_index,
                content_index=0,
                part=part,
            ),
        ]

    def output_text(
        self, delta: str, logprobs: list[TokenLogprob] | None = None
    ) -> list[ResponseStreamEvent]:
        """Message text; `logprobs`: those of the tokens that produced it (tokens that have
        produced no text yet, an incomplete UTF-8 character, wait for the next delta)."""
        if logprobs:
            self._held_logprobs += [logprob_json(lp) for lp in logprobs]
        if not delta:
            return []
        events = self._close_open("completed") if self._call is not None else []
        if self._message is None:
            events += self._open_message()
        msg = self._message
        assert msg is not None
        msg.text += delta
        delta_logprobs, self._held_logprobs = self._held_logprobs, []
        msg.logprobs += delta_logprobs
        events.append(
            self._event(
                ResponseTextDeltaEvent,
                type="response.output_text.delta",
                item_id=msg.id,
                output_index=msg.output_index,
                content_index=0,
                delta=delta,
                logprobs=delta_logprobs,
            )
        )
        return events

    def _close_message(self, item_status: str) -> list[ResponseStreamEvent]:
        events = self._open_message() if self._message is None else []
        msg = self._message
        assert msg is not None
        part = {
            "type": "output_text",
            "text": msg.text,
            "annotations": [],
            "logprobs": msg.logprobs,
        }
        item = {
            "id": msg.id,
            "type": "message",
            "status": item_status,
            "role": "assistant",
            "content": [part],
        }
        self.output[msg.output_index] = item
        self._message = None
        events += [
            self._event(
                ResponseTextDoneEvent,
                type="response.output_text.done",
                item_id=msg.id,
                output_index=msg.output_index,
                content_index=0,
                text=msg.text,
                logprobs=msg.logprobs,
            ),
            self._event(
                ResponseContentPartDoneEvent,
                type="response.content_part.done",
                item_id=msg.id,
                output_index=msg.output_index,
                content_index=0,
                part=part,
            ),
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=msg.output_index,
                item=ResponseOutputMessage.model_validate(item),
            ),
        ]
        return events

    def _close_open(self, status: str) -> list[ResponseStreamEvent]:
        if self._reasoning is not None:
            return self._close_reasoning(status)
        if self._message is not None:
            return self._close_message(status)
        if self._call is not None:
            return self.function_call_done(self._call.arguments, complete=status == "completed")
        return []

    # -- reasoning ------------------------------------------------------------------------

    def reasoning_text(self, delta: str) -> list[ResponseStreamEvent]:
        """Thinking text: a `reasoning` item ahead of the answer, streamed as
        `response.reasoning_text.delta` (never `output_text`)."""
        if not delta:
            return []
        events: list[ResponseStreamEvent] = []
        if self._reasoning is None:
            events += self._close_open("completed")
            events += self._open_reasoning()
        rs = self._reasoning
        assert rs is not None
        rs.text += delta
        events.append(
            self._event(
                ResponseReasoningTextDeltaEvent,
                type="response.reasoning_text.delta",
                item_id=rs.id,
                output_index=rs.output_index,
                content_index=0,
                delta=delta,
            )
        )
        return events

    def _open_reasoning(self) -> list[ResponseStreamEvent]:
        rs = _OpenReasoning(new_id("rs"), len(self.output))
        self._reasoning = rs
        item = rs.item("in_progress", partial=True)
        self.output.append(item)
        return [
            self._event(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=rs.output_index,
                item=item,
            ),
            self._event(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                item_id=rs.id,
                output_index=rs.output_index,
                content_index=0,
                part=_reasoning_part(""),
            ),
        ]

    def _close_reasoning(self, item_status: str) -> list[ResponseStreamEvent]:
        rs = self._reasoning
        assert rs is not None
        self._reasoning = None
        item = rs.item(item_status)
        self.output[rs.output_index] = item
        return [
            self._event(
                ResponseReasoningTextDoneEvent,
                type="response.reasoning_text.done",
                item_id=rs.id,
                output_index=rs.output_index,
                content_index=0,
                text=rs.text,
            ),
            self._event(
                ResponseContentPartDoneEvent,
                type="response.content_part.done",
                item_id=rs.id,
                output_index=rs.output_index,
                content_index=0,
                part=_reasoning_part(rs.text),
            ),
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=rs.output_index,
                item=ResponseReasoningItem.model_validate(item),
            ),
        ]

    # -- function calls -------------------------------------------------------------------

    def function_call_start(self, name: str) -> list[ResponseStreamEvent]:
        """A call begins: any text before it is closed as its own message item."""
        events = self._close_open("completed")
        call = _OpenCall(new_id("fc"), new_id("call"), name, len(self.output))
        self._call = call
        item = call.item("in_progress")
        self.output.append(item)
        events.append(
            self._event(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=call.output_index,
                item=item,
            )
        )
        return events

    def function_call_arguments(self, delta: str) -> list[ResponseStreamEvent]:
        call = self._call
        if call is None or not delta:
            return []
        call.arguments += delta
        return [
            self._event(
                ResponseFunctionCallArgumentsDeltaEvent,
                type="response.function_call_arguments.delta",
                item_id=call.id,
                output_index=call.output_index,
                delta=delta,
            )
        ]

    def function_call_done(self, arguments: str, *, complete: bool) -> list[ResponseStreamEvent]:
        call = self._call
        if call is None:
            return []
        events = []
        if arguments != call.arguments and arguments.startswith(call.arguments):
            events += self.function_call_arguments(arguments[len(call.arguments) :])
        self._call = None
        item = call.item("completed" if complete else "incomplete")
        self.output[call.output_index] = item
        events += [
            self._event(
                ResponseFunctionCallArgumentsDoneEvent,
                type="response.function_call_arguments.done",
                item_id=call.id,
                output_index=call.output_index,
                arguments=call.arguments,
                name=call.name,  # required by older SDKs (3.3.x), harmless for newer
            ),
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=call.output_index,
                item=ResponseFunctionToolCall.model_validate(item),
            ),
        ]
        return events

    def apply_parsed(
        self,
        parsed: Sequence[ParseEvent | ReasoningDelta],
        logprobs: LogprobAligner | None = None,
    ) -> list[ResponseStreamEvent]:
        """Drive the machine from the tool-call parser's reading of the output (thinking
        first, when `reasoning.ReasoningReader` split it off); `logprobs` (fed the same
        chunks as the reader) gives message text the logprobs of its tokens."""
        events: list[ResponseStreamEvent] = []
        for p in parsed:
            if isinstance(p, ReasoningDelta):
                events += self.reasoning_text(p.text)
                continue
            if self._reasoning is not None:  # the answer begins: thinking is over
                events += self._close_reasoning("completed")
            if isinstance(p, TextDelta):
                lps = logprobs.take(p.start, p.start + len(p.text)) if logprobs else None
                events += self.output_text(p.text, lps)
            elif isinstance(p, CallStarted):
                events += self.function_call_start(p.name)
            elif isinstance(p, ArgumentsDelta):
                events += self.function_call_arguments(p.delta)
            else:
                events += self.function_call_done(p.arguments, complete=p.complete)
        return events

    def finish(
        self, *, usage: Usage, incomplete_reason: str | None = None
    ) -> list[ResponseStreamEvent]:
        """Close open items and emit `response.completed` or `response.incomplete`."""
        self.usage = usage
        item_status = "incomplete" if incomplete_reason else "completed"
        events = self._close_open(item_status)
        # An empty answer is still one (empty) message; a budget spent while thinking
        # leaves only the (incomplete) reasoning item.
        answered = any(o["type"] != "reasoning" for o in self.output)
        if not self.output or not (answered or incomplete_reason):
            events += self._close_message(item_status)
        if incomplete_reason:
            self.status = "incomplete"
            self.incomplete_reason = incomplete_reason
            events.append(
                self._event(
                    ResponseIncompleteEvent, type="response.incomplete", response=self.snapshot()
                )
            )
        else:
            self.status = "completed"
            self.completed_at = int(time.time())
            events.append(
                self._event(
                    ResponseCompletedEvent, type="response.completed", response=self.snapshot()
                )
            )
        return events

    def fail(self, message: str, *, code: str = "server_error") -> list[ResponseStreamEvent]:
        """Close open items as incomplete and emit `response.failed`."""
        events = self._close_open("incomplete")
        self.status = "failed"
        self.error = {"code": code, "message": message}
        events.append(
            self._event(ResponseFailedEvent, type="response.failed", response=self.snapshot())
        )
        return events

    def cancel(self, *, usage: Usage) -> list[ResponseStreamEvent]:
        """Generation stopped on request: keep partial output, status `cancelled`."""
        self.usage = usage
        events = self._close_open("incomplete")
        self.status = "cancelled"
        return events
