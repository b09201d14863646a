"""The one event state machine of a response.

It emits every typed SSE event, numbered from 0, AND builds the final `Response`. Streaming
and non-streaming requests drive the same machine, so the ids, order and content a client
sees are identical whichever way it asked. Events and objects are the `openai` SDK's own
pydantic types, so a field we misspell fails here, not in a client.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseApplyPatchToolCall,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionShellToolCall,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseQueuedEvent,
    ResponseReasoningItem,
    ResponseReasoningSummaryPartAddedEvent,
    ResponseReasoningSummaryPartDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningSummaryTextDoneEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses.response_output_item import LocalShellCall
from pydantic import BaseModel

from respd.engines.base import TokenLogprob
from respd.service.generation.logprobs import logprob_json
from respd.service.generation.output import (
    ArgumentsDelta,
    CallStarted,
    Finished,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from respd.service.ids import new_id
from respd.service.tools.definitions import ToolRoute

# pydantic's own `model_construct` (the classmethod's function), not the SDK's override.
_construct: Callable[..., Any] = vars(BaseModel)["model_construct"].__func__

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


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


def usage_json(usage: Usage) -> dict[str, Any]:
    """Responses' `usage` object."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


TextKind = Literal["message", "reasoning"]


@dataclass
class _OpenText:
    """A message or reasoning item being written: one content part that grows by deltas."""

    kind: TextKind
    id: str
    output_index: int
    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # message text only

    def part(self) -> dict[str, Any]:
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {
            "type": "output_text",
            "text": self.text,
            "annotations": [],
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
_TEXT_EVENTS: dict[TextKind, tuple[str, type[BaseModel], type[BaseModel], type[BaseModel]]] = {
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
_ID_PREFIX: dict[TextKind, str] = {"message": "msg", "reasoning": "rs"}


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_OPEN_INPUT = re.compile(r'"input"\s*:\s*"')
# Per kind of call: its item type and the prefix of its item id.
_CALL_ITEM = {
    "function": ("function_call", "fc"),
    "custom": ("custom_tool_call", "ctc"),
    "local_shell": ("local_shell_call", "lsh"),
    "shell": ("shell_call", "sh"),
    "apply_patch": ("apply_patch_call", "apc"),
}
_PATCH_OPERATIONS = ("create_file", "update_file", "delete_file")
# The item classes of the client-run tools' calls, which finish without argument events.
_CLIENT_CALL_TYPES: dict[str, type[BaseModel]] = {
    "local_shell": LocalShellCall,
    "shell": ResponseFunctionShellToolCall,
    "apply_patch": ResponseApplyPatchToolCall,
}


@dataclass
class _OpenCall:
    id: str
    call_id: str
    route: ToolRoute
    output_index: int
    arguments: str = ""  # the JSON the model wrote, as it arrives

    def input_text(self) -> str:
        """A custom tool call's text: its `input` argument (as far as it was written, for
        a call cut short)."""
        value = _json_object(self.arguments).get("input")
        if isinstance(value, str):
            return value
        m = _OPEN_INPUT.search(self.arguments)
        if m is None:
            return ""
        text = self.arguments[m.end() :]
        for cut in range(len(text), max(len(text) - 6, -1), -1):  # a cut escape sequence
            try:
                partial = json.loads('"' + text[:cut] + '"')
            except ValueError:
                continue
            return partial if isinstance(partial, str) else ""
        return ""

    def patch_operation(self) -> dict[str, Any]:
        """An apply_patch call's `operation`, whole even when the model's arguments are not
        (a cut call, an unknown operation type): the client reads its path and diff."""
        args = _json_object(self.arguments)
        kind = args.get("type")
        op: dict[str, Any] = {
            "type": kind if kind in _PATCH_OPERATIONS else "update_file",
            "path": str(args.get("path") or ""),
        }
        if op["type"] != "delete_file":
            op["diff"] = str(args.get("diff") or "")
        return {"operation": op}

    def item(self, status: str) -> dict[str, Any]:
        route = self.route
        if route.kind == "apply_patch" and status != "completed":
            status = "in_progress"  # the item type knows no other unfinished state
        head = {"id": self.id, "type": _CALL_ITEM[route.kind][0], "status": status}
        if route.kind == "local_shell":
            args = _json_object(self.arguments)
            command = args.get("command")
            action: dict[str, Any] = {
                "type": "exec",
                "command": [str(c) for c in command] if isinstance(command, list) else [],
                "env": {},
            }
            for key in ("working_directory", "timeout_ms"):
                if args.get(key) is not None:
                    action[key] = args[key]
            return {**head, "call_id": self.call_id, "action": action}
        if route.kind == "shell":
            args = _json_object(self.arguments)
            commands = args.get("commands")
            timeout = args.get("timeout_ms")
            action = {
                "commands": [str(c) for c in commands] if isinstance(commands, list) else [],
                "timeout_ms": timeout if isinstance(timeout, int) else None,
                "max_output_length": None,
            }
            return {**head, "call_id": self.call_id, "action": action}
        if route.kind == "apply_patch":
            return {**head, "call_id": self.call_id, **self.patch_operation()}
        if route.kind == "custom":
            head["input"] = self.input_text()
        else:
            head["arguments"] = self.arguments
        head.update(call_id=self.call_id, name=route.name)
        if route.namespace:
            head["namespace"] = route.namespace
        return head


@dataclass
class ResponseEventMachine:
    """Drives one response from `created` to its terminal event.

    `echo` holds the request settings the Response object repeats (instructions, model,
    temperature, tools, ...); see `service/responses.py` for how it is built.
    """

    echo: dict[str, Any]
    # How a call maps back to an item, by the name the model was shown; a name not here
    # is a plain function call.
    routes: dict[str, ToolRoute] = field(default_factory=dict)
    # Seals a reasoning item's text into its `encrypted_content` (when the request asked
    # to include it), so a `store: false` client can hand the reasoning back.
    seal_reasoning: Callable[[str], str] | None = None
    # `reasoning.summary` asked for (`auto`, `concise`, `detailed`): reasoning items get a
    # summary part, with its events.
    reasoning_summary: str | None = None
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None
    generated_tokens: int = 0  # tokens seen so far: the usage of a response cut short
    # A remote engine's failure, as the HTTP status a non-streaming client gets.
    error_status: int | None = None
    _seq: int = 0
    _text: _OpenText | None = None  # the message or reasoning item being written
    _call: _OpenCall | None = None
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
            "usage": usage_json(self.usage) if self.usage else None,
        }
        body.update(self.echo)
        return Response.model_validate(body)

    def _output_so_far(self) -> list[dict[str, Any]]:
        """Output items, with the text of a message or reasoning item still being written
        (a live poll)."""
        output = list(self.output)
        if self._text is not None:
            output[self._text.output_index] = self._text.item("in_progress")
        return output

    def _event(self, cls: type[BaseModel], **fields: Any) -> ResponseStreamEvent:
        event = cls.model_validate({**fields, "sequence_number": self._seq})
        self._seq += 1
        return event  # type: ignore[return-value]

    def _delta_event(self, cls: type[BaseModel], **fields: Any) -> ResponseStreamEvent:
        """A per-token event of plain fields (strings, integers, an empty list), built
        without validation: its fields are this machine's own, and it is made once per
        token. Through pydantic's own `model_construct`: the SDK's override walks every
        field's type to build nested models (about 10x the cost), and these have none."""
        event: ResponseStreamEvent = _construct(cls, **fields, sequence_number=self._seq)
        self._seq += 1
        return event

    # -- transitions ----------------------------------------------------------------------

    @property
    def sequence_number(self) -> int:
        """The number the next event will carry."""
        return self._seq

    def start(self) -> list[ResponseStreamEvent]:
        """`created`, then `in_progress`; a background response (which starts out queued)
        stays `queued` until the engine takes it up (`begin`)."""
        snap = self.snapshot()
        events = [self._event(ResponseCreatedEvent, type="response.created", response=snap)]
        if self.status == "queued":
            events.append(self._event(ResponseQueuedEvent, type="response.queued", response=snap))
            return events
        events.append(
            self._event(ResponseInProgressEvent, type="response.in_progress", response=snap)
        )
        return events

    def begin(self) -> list[ResponseStreamEvent]:
        """The engine took the response up: a queued one is now `in_progress`."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        return [
            self._event(
                ResponseInProgressEvent, type="response.in_progress", response=self.snapshot()
            )
        ]

    def _open_text(self, kind: TextKind) -> list[ResponseStreamEvent]:
        """Close whatever is open, then announce a new item of `kind` and its part."""
        events = self._close_open("completed")
        t = _OpenText(kind, new_id(_ID_PREFIX[kind]), len(self.output))
        self._text = t
        item = t.item("in_progress", empty=True)
        self.output.append(item)
        events += [
            self._event(
                ResponseOutputItemAddedEvent,
                type="response.output_item.added",
                output_index=t.output_index,
                item=item,
            ),
            self._event(
                ResponseContentPartAddedEvent,
                type="response.content_part.added",
                item_id=t.id,
                output_index=t.output_index,
                content_index=0,
                part=t.part(),
            ),
        ]
        return events

    def _text_delta(
        self, kind: TextKind, delta: str, logprobs: list[dict[str, Any]]
    ) -> list[ResponseStreamEvent]:
        events = [] if self._text is not None and self._text.kind == kind else self._open_text(kind)
        t = self._text
        assert t is not None
        t.text += delta
        prefix, delta_cls, _, _ = _TEXT_EVENTS[kind]
        extra: dict[str, Any] = {"logprobs": logprobs} if kind == "message" else {}
        t.logprobs += logprobs
        make = self._event if logprobs else self._delta_event
        events.append(
            make(
                delta_cls,
                type=f"{prefix}.delta",
                item_id=t.id,
                output_index=t.output_index,
                content_index=0,
                delta=delta,
                **extra,
            )
        )
        return events

    def _close_text(self, item_status: str, phase: str | None = None) -> list[ResponseStreamEvent]:
        t = self._text
        assert t is not None
        self._text = None
        item = t.item(item_status)
        if t.kind == "message" and phase is not None:
            item["phase"] = phase
        if t.kind == "reasoning" and self.seal_reasoning is not None:
            item["encrypted_content"] = self.seal_reasoning(t.text)
        summary = (
            summarize_reasoning(t.text, self.reasoning_summary)
            if t.kind == "reasoning" and self.reasoning_summary
            else ""
        )
        if summary:
            item["summary"] = [{"type": "summary_text", "text": summary}]
        self.output[t.output_index] = item
        prefix, _, done_cls, item_cls = _TEXT_EVENTS[t.kind]
        extra: dict[str, Any] = {"logprobs": t.logprobs} if t.kind == "message" else {}
        closing = [
            self._event(
                done_cls,
                type=f"{prefix}.done",
                item_id=t.id,
                output_index=t.output_index,
                content_index=0,
                text=t.text,
                **extra,
            ),
            self._event(
                ResponseContentPartDoneEvent,
                type="response.content_part.done",
                item_id=t.id,
                output_index=t.output_index,
                content_index=0,
                part=t.part(),
            ),
        ]
        if summary:
            closing += self._summary_events(t, summary)
        return [
            *closing,
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=t.output_index,
                item=item_cls.model_validate(item),
            ),
        ]

    def _summary_events(self, t: _OpenText, summary: str) -> list[ResponseStreamEvent]:
        part = {"type": "summary_text", "text": summary}
        where = {"item_id": t.id, "output_index": t.output_index, "summary_index": 0}
        return [
            self._event(
                ResponseReasoningSummaryPartAddedEvent,
                type="response.reasoning_summary_part.added",
                part={**part, "text": ""},
                **where,
            ),
            self._event(
                ResponseReasoningSummaryTextDeltaEvent,
                type="response.reasoning_summary_text.delta",
                delta=summary,
                **where,
            ),
            self._event(
                ResponseReasoningSummaryTextDoneEvent,
                type="response.reasoning_summary_text.done",
                text=summary,
                **where,
            ),
            self._event(
                ResponseReasoningSummaryPartDoneEvent,
                type="response.reasoning_summary_part.done",
                part=part,
                **where,
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
        held, self._held_logprobs = self._held_logprobs, []
        return self._text_delta("message", delta, held)

    def reasoning_text(self, delta: str) -> list[ResponseStreamEvent]:
        """Thinking text: a `reasoning` item ahead of the answer, streamed as
        `response.reasoning_text.delta` (never `output_text`)."""
        return self._text_delta("reasoning", delta, []) if delta else []

    def _close_open(self, status: str, phase: str | None = None) -> list[ResponseStreamEvent]:
        """Close the open item; a message closed by a call is `commentary`, one closed by
        the end of the response its `final_answer` (`phase`)."""
        if self._text is not None:
            return self._close_text(status, phase)
        if self._call is not None:
            return self.function_call_done(self._call.arguments, complete=status == "completed")
        return []

    # -- function calls -------------------------------------------------------------------

    def function_call_start(self, name: str) -> list[ResponseStreamEvent]:
        """A call begins: any text before it is closed as its own message item."""
        events = self._close_open("completed", "commentary")
        route = self.routes.get(name) or ToolRoute("function", name)
        call = _OpenCall(new_id(_CALL_ITEM[route.kind][1]), new_id("call"), route, len(self.output))
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
        """Argument text as it arrives; only a function call streams it (a custom tool's
        input is known once its JSON closes, a shell action is sent whole)."""
        call = self._call
        if call is None or not delta:
            return []
        call.arguments += delta
        if call.route.kind != "function":
            return []
        return [
            self._delta_event(
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
        done: BaseModel
        if call.route.kind == "function":
            events.append(
                self._event(
                    ResponseFunctionCallArgumentsDoneEvent,
                    type="response.function_call_arguments.done",
                    item_id=call.id,
                    output_index=call.output_index,
                    arguments=call.arguments,
                    name=call.route.name,  # required by older SDKs (3.3.x), harmless for newer
                )
            )
            done = ResponseFunctionToolCall.model_validate(item)
        elif call.route.kind == "custom":
            text = call.input_text()
            if text:
                events.append(
                    self._event(
                        ResponseCustomToolCallInputDeltaEvent,
                        type="response.custom_tool_call_input.delta",
                        item_id=call.id,
                        output_index=call.output_index,
                        delta=text,
                    )
                )
            events.append(
                self._event(
                    ResponseCustomToolCallInputDoneEvent,
                    type="response.custom_tool_call_input.done",
                    item_id=call.id,
                    output_index=call.output_index,
                    input=text,
                )
            )
            done = ResponseCustomToolCall.model_validate(item)
        else:
            done = _CLIENT_CALL_TYPES[call.route.kind].model_validate(item)
        events.append(
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=call.output_index,
                item=done,
            )
        )
        return events

    def apply(self, event: OutputEvent) -> list[ResponseStreamEvent]:
        """Drive the machine from one generation event (thinking first, then the answer's
        text and calls)."""
        if isinstance(event, ReasoningDelta):
            return self.reasoning_text(event.text)
        events: list[ResponseStreamEvent] = []
        if self._text is not None and self._text.kind == "reasoning":
            events += self._close_text("completed")  # the answer begins: thinking is over
        if isinstance(event, TextDelta):
            events += self.output_text(event.text, event.logprobs)
        elif isinstance(event, CallStarted):
            events += self.function_call_start(event.name)
        elif isinstance(event, ArgumentsDelta):
            events += self.function_call_arguments(event.delta)
        else:
            events += self.function_call_done(event.arguments, complete=event.complete)
        return events

    def whole_item(self, item: dict[str, Any]) -> list[ResponseStreamEvent]:
        """An item made in one piece (a compaction): announced and finished at once."""
        events = self._close_open("completed")
        index = len(self.output)
        self.output.append(item)
        for cls, kind in (
            (ResponseOutputItemAddedEvent, "response.output_item.added"),
            (ResponseOutputItemDoneEvent, "response.output_item.done"),
        ):
            events.append(self._event(cls, type=kind, output_index=index, item=item))
        return events

    def apply_all(self, events: list[OutputEvent]) -> list[ResponseStreamEvent]:
        return [out for event in events for out in self.apply(event)]

    def end(self, finished: Finished) -> list[ResponseStreamEvent]:
        """The terminal events for how the generation ended."""
        if finished.reason == "error" and finished.status is not None:
            self.error_status = finished.status
            if finished.status < 500:
                return self.fail(f"The upstream engine refused the request: {finished.error}")
            return self.fail("The upstream engine failed while generating this response.")
        if finished.reason == "error":
            return self.fail("The model failed while generating this response.")
        if finished.reason == "cancelled":
            return self.cancel(usage=finished.usage)
        if finished.reason == "length":
            return self.finish(usage=finished.usage, incomplete_reason="max_output_tokens")
        if finished.reason == "interrupted":
            # The server shut down: incomplete, with no reason the API defines for it.
            return self.finish(usage=finished.usage, incomplete=True)
        return self.finish(usage=finished.usage)

    def finish(
        self, *, usage: Usage, incomplete_reason: str | None = None, incomplete: bool = False
    ) -> list[ResponseStreamEvent]:
        """Close open items and emit `response.completed` or `response.incomplete` (with
        `incomplete_reason`, or none when `incomplete` alone is set)."""
        self.usage = usage
        incomplete = incomplete or incomplete_reason is not None
        item_status = "incomplete" if incomplete else "completed"
        events = self._close_open(item_status, "final_answer")
        # An empty answer is still one (empty) message; a budget spent while thinking
        # leaves only the (incomplete) reasoning item.
        answered = any(o["type"] != "reasoning" for o in self.output)
        if not self.output or not (answered or incomplete):
            events += self._open_text("message") + self._close_text(item_status, "final_answer")
        if incomplete:
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
