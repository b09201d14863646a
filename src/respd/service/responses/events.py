"""The one event state machine of a response.

It emits every typed SSE event, numbered from 0, AND builds the final `Response`. Streaming
and non-streaming requests drive the same machine, so the ids, order and content a client
sees are identical whichever way it asked. Events and objects are the `openai` SDK's own
pydantic types, so a field we misspell fails here, not in a client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.responses import (
    Response,
    ResponseCompactionCompactingEvent,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseQueuedEvent,
    ResponseStreamEvent,
)
from pydantic import BaseModel

from respd.engines.base import TokenLogprob
from respd.engines.route import RouteReport
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
from respd.service.responses.hosted_items import (
    announced,
    ended_events,
    finished_item,
    started_events,
)
from respd.service.responses.text_items import (
    ID_PREFIX,
    TEXT_EVENTS,
    OpenText,
    TextKind,
    citation_events,
    summarize_reasoning,
    summary_events,
)
from respd.service.responses.tool_items import CALL_ITEM, SERVER_KINDS, OpenCall
from respd.service.tools.definitions import ToolRoute
from respd.service.tools.hosted.base import Outcome

# The item types of calls the client runs (or approves): a steer waits for their output.
CLIENT_CALL_TYPES = frozenset(
    item_type for kind, (item_type, _) in CALL_ITEM.items() if kind not in SERVER_KINDS
)

# pydantic's own `model_construct` (the classmethod's function), not the SDK's override.
_construct: Callable[..., Any] = vars(BaseModel)["model_construct"].__func__

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


def usage_json(usage: Usage) -> dict[str, Any]:
    """Responses' `usage` object."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


@dataclass
class ResponseEventMachine:
    """Drives one response from `created` to its terminal event. `echo` holds the
    request settings the Response object repeats (instructions, model, tools, ...)."""

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
    route: RouteReport | None = None  # which provider of a routed model answered
    _seq: int = 0
    _text: OpenText | None = None  # the message or reasoning item being written
    _call: OpenCall | None = None
    _held_logprobs: list[dict[str, Any]] = field(default_factory=list)  # tokens with no text yet
    # Steering (`response.steer`): set once input is queued to take this response over, so
    # its generation stops at the next safe boundary; `post` queues the notices its stream
    # carries, numbered in order when `notices` takes them.
    steered: bool = False
    # Calls of tools this server runs, written and waiting to run (their items stay open).
    pending: list[OpenCall] = field(default_factory=list)
    # The annotations (citations) of the answer's text, once it is whole.
    annotate: Callable[[str], list[dict[str, Any]]] | None = None
    _posted: list[tuple[type[BaseModel], dict[str, Any]]] = field(default_factory=list)

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
        if self.route is not None:
            body["provider"] = self.route.wire()
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

    def post(self, cls: type[BaseModel], **fields: Any) -> None:
        """Queue an event from outside the generation (a steering notice) for `notices`."""
        self._posted.append((cls, fields))

    def notices(self) -> list[ResponseStreamEvent]:
        """The posted events, numbered where they join the stream."""
        posted, self._posted = self._posted, []
        return [self._event(cls, **fields) for cls, fields in posted]

    def stop_for_steer(self, event: OutputEvent) -> list[ResponseStreamEvent] | None:
        """The safe boundary of a steered response: when `event` would begin a new output
        item, the events that finish the open one (the response stops there); None while
        an item is being written, or once a call waits for the client's output (such a
        response runs to its end and the steering input waits for that output)."""
        if any(o["type"] in CLIENT_CALL_TYPES for o in self.output):
            return None
        text = self._text
        if isinstance(event, ReasoningDelta):
            opens = bool(event.text) and (text is None or text.kind != "reasoning")
        elif isinstance(event, TextDelta):
            opens = bool(event.text) and (text is None or text.kind != "message")
        else:
            opens = isinstance(event, CallStarted)
        return self._close_open("completed") if opens else None

    # -- transitions ----------------------------------------------------------------------

    @property
    def sequence_number(self) -> int:
        """The number the next event will carry."""
        return self._seq

    def unsend(self, sent: int) -> None:
        """Only `sent` events left: those built after them (a terminal event that could
        not be stored) are dropped, so the next event keeps the numbering gapless."""
        self._seq = min(self._seq, sent)

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
        t = OpenText(kind, new_id(ID_PREFIX[kind]), len(self.output))
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
        prefix, delta_cls, _, _ = TEXT_EVENTS[kind]
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
        cited = self._citations(t)  # a cut answer still cites what it read
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
        prefix, _, done_cls, item_cls = TEXT_EVENTS[t.kind]
        extra: dict[str, Any] = {"logprobs": t.logprobs} if t.kind == "message" else {}
        closing = [
            *cited,
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
            closing += self._events(summary_events(t, summary))
        return [
            *closing,
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=t.output_index,
                item=item_cls.model_validate(item),
            ),
        ]

    def _citations(self, t: OpenText) -> list[ResponseStreamEvent]:
        """A finished answer's citations of what server-run searches found: set on its
        part, one `annotation.added` event each."""
        if t.kind != "message" or self.annotate is None:
            return []
        t.annotations = self.annotate(t.text)
        return self._events(citation_events(t))

    def _events(
        self, pairs: list[tuple[type[BaseModel], dict[str, Any]]]
    ) -> list[ResponseStreamEvent]:
        """Events made elsewhere as (class, fields), numbered here in order."""
        return [self._event(cls, **fields) for cls, fields in pairs]

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
        call = OpenCall(new_id(CALL_ITEM[route.kind][1]), new_id("call"), route, len(self.output))
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
        streamed = call.delta_event(delta)
        return [] if streamed is None else [self._delta_event(streamed[0], **streamed[1])]

    def function_call_done(self, arguments: str, *, complete: bool) -> list[ResponseStreamEvent]:
        call = self._call
        if call is None:
            return []
        events = []
        if arguments != call.arguments and arguments.startswith(call.arguments):
            events += self.function_call_arguments(arguments[len(call.arguments) :])
        self._call = None
        events += self._events(call.closing_events())
        if complete and call.route.kind in SERVER_KINDS:
            self.output[call.output_index] = call.item("in_progress")
            self.pending.append(call)  # finished once it has run (`run_finished`)
            return events
        item = call.item("completed" if complete else "incomplete")
        self.output[call.output_index] = item
        events.append(
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=call.output_index,
                item=call.done_item(item),
            )
        )
        return events

    # -- calls this server runs ---------------------------------------------------------

    def run_started(self, index: int) -> list[ResponseStreamEvent]:
        """The call whose item is at `index` starts running."""
        where = {"item_id": self.output[index]["id"], "output_index": index}
        return self._events(started_events(self.output[index], where))

    def run_finished(self, index: int, outcome: Outcome) -> list[ResponseStreamEvent]:
        """The call at `index` ran: its item finished with what the run gave."""
        item = finished_item(self.output[index], outcome)
        self.output[index] = item
        where = {"item_id": item["id"], "output_index": index}
        return self._events(ended_events(item, where)) + self.item_done(index, item)

    def ran_item(self, item: dict[str, Any]) -> list[ResponseStreamEvent]:
        """An item run before the model's first pass (a tools listing, an approved call),
        told as if it ran now: added, started, ended, done."""
        index, events = self.add_item(announced(item))
        where = {"item_id": item["id"], "output_index": index}
        events += self._events(started_events(item, where) + ended_events(item, where))
        return events + self.item_done(index, item)

    def close_pending(self) -> list[ResponseStreamEvent]:
        """Calls that will not run (the response ends first): finished `incomplete`."""
        pending, self.pending = self.pending, []
        return [e for c in pending for e in self.item_done(c.output_index, c.item("incomplete"))]

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
        """An item made in one piece: announced and finished at once."""
        index, events = self.add_item(item)
        return events + self.item_done(index, item)

    def add_item(self, item: dict[str, Any]) -> tuple[int, list[ResponseStreamEvent]]:
        """Announce an item made outside the generation (a compaction); `item_done`
        finishes it, `drop_item` takes it back."""
        events = self._close_open("completed")
        index = len(self.output)
        self.output.append(item)
        added = self._event(
            ResponseOutputItemAddedEvent,
            type="response.output_item.added",
            output_index=index,
            item=item,
        )
        return index, [*events, added]

    def item_done(self, index: int, item: dict[str, Any]) -> list[ResponseStreamEvent]:
        self.output[index] = item
        return [
            self._event(
                ResponseOutputItemDoneEvent,
                type="response.output_item.done",
                output_index=index,
                item=item,
            )
        ]

    def drop_item(self, index: int) -> None:
        """An announced item that never finished (its compaction failed)."""
        del self.output[index]

    def compacting(self, index: int) -> ResponseStreamEvent:
        """Progress of the compaction item at `index`: new summary text was sampled."""
        return self._event(
            ResponseCompactionCompactingEvent,
            type="response.compaction.compacting",
            item_id=self.output[index]["id"],
            output_index=index,
        )

    def apply_all(self, events: list[OutputEvent]) -> list[ResponseStreamEvent]:
        return [out for event in events for out in self.apply(event)]

    def end(self, finished: Finished) -> list[ResponseStreamEvent]:
        """The terminal events for how the generation ended."""
        self.route = finished.route or self.route
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
        if finished.reason == "steered":
            return self.finish(usage=finished.usage, incomplete_reason="steered")
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
        events = self._close_open(item_status, "final_answer") + self.close_pending()
        # An empty answer is still one (empty) message; a budget spent while thinking
        # leaves only the (incomplete) reasoning item.
        answered = any(o["type"] != "reasoning" for o in self.output)
        steered = incomplete_reason == "steered"  # stopped before its answer: none made up
        if (not self.output and not steered) or not (answered or incomplete):
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

    def prepared(self, *, usage: Usage) -> list[ResponseStreamEvent]:
        """A turn prepared without output (`generate: false`): `response.completed` with
        no output items."""
        self.usage = usage
        self.status = "completed"
        self.completed_at = int(time.time())
        return [
            self._event(ResponseCompletedEvent, type="response.completed", response=self.snapshot())
        ]

    def fail(self, message: str, *, code: str = "server_error") -> list[ResponseStreamEvent]:
        """Close open items as incomplete and emit `response.failed`."""
        events = self._close_open("incomplete") + self.close_pending()
        self.status = "failed"
        self.error = {"code": code, "message": message}
        events.append(
            self._event(ResponseFailedEvent, type="response.failed", response=self.snapshot())
        )
        return events

    def cancel(self, *, usage: Usage) -> list[ResponseStreamEvent]:
        """Generation stopped on request: keep partial output, status `cancelled`."""
        self.usage = usage
        events = self._close_open("incomplete") + self.close_pending()
        self.status = "cancelled"
        return events
