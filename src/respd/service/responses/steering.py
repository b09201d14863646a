"""Steering: user input sent to a response while it runs (WebSocket `response.steer`).

A steer names a response running on the same connection and carries user messages. Once
checked it is queued on that response and acknowledged in its stream
(`response.steer.accepted`, numbered where it joins); the generation then stops at its next
safe boundary (never inside a call, never once a call waits for the client), and the
response ends `incomplete` with reason `steered`. A successor response follows on its own:
the same settings, `previous_response_id` the steered response, the queued messages in
submission order as its input; its `response.created` commits them. A response that
finished first keeps its status and is followed the same way. One that stopped for the
client's tool output keeps the input queued (`response.steer.pending`, with a stub for each
output it waits for); the client's next `response.create` continuing it gets the queued
messages ahead of its own input. Input that cannot be committed comes back in
`response.steer.failed`.

This module keeps a connection's steering state and makes the notices; the transport runs
the responses and sends what it is handed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import (
    ResponseSteerAcceptedEvent,
    ResponseSteerPendingEvent,
)

from respd.protocol.responses import CreateResponseRequest
from respd.service.ids import new_id
from respd.service.responses.compaction import compaction_turn
from respd.service.responses.events import ResponseEventMachine
from respd.store.base import JSON

# How much input may wait on one response, and how many finished responses a connection
# remembers to say why a late steer cannot reach them.
MAX_QUEUED = 16
MAX_REMEMBERED = 256
_STEER_FIELDS = frozenset({"type", "previous_response_id", "input"})
_MESSAGE_FIELDS = frozenset({"type", "role", "content"})
_PARTS = frozenset({"input_text", "input_image", "input_file"})
# What the client sends back for each call it runs: the stub's type and identifying fields.
_STUBS = {
    "function_call": ("function_call_output", ("call_id", "name")),
    "custom_tool_call": ("custom_tool_call_output", ("call_id",)),
    "shell_call": ("shell_call_output", ("call_id",)),
    "apply_patch_call": ("apply_patch_call_output", ("call_id",)),
}


class SteerRefused(Exception):
    """A steer that cannot be queued, with its steering error code."""

    def __init__(self, code: str, message: str, *, shown: str | list[JSON] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.shown = shown  # the input as the refusal hands it back, where it is known


@dataclass
class Steer:
    id: str
    target: str
    input: str | list[JSON]  # as sent: a refusal hands it back unchanged

    def items(self) -> list[JSON]:
        """The input as user message items."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [{"type": "message", **item} for item in self.input]

    @property
    def shown(self) -> str | list[JSON]:
        """The input as a refusal hands it back: as sent, each message typed."""
        return self.input if isinstance(self.input, str) else self.items()


@dataclass
class Target:
    """A response on this connection that steering can name."""

    body: JSON  # the create body it ran from: a successor's settings
    machine: ResponseEventMachine
    unsupported: str | None = None  # why it cannot be steered
    queued: list[Steer] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.machine.id

    @property
    def running(self) -> bool:
        return self.machine.status in ("queued", "in_progress")


@dataclass
class Outcome:
    """What follows a finished response: notices to send, and the successor to run."""

    notices: list[JSON] = field(default_factory=list)
    successor: JSON | None = None
    steers: list[Steer] = field(default_factory=list)


def unsteerable(req: CreateResponseRequest) -> str | None:
    """Why a response made for `req` cannot be steered (None: it can)."""
    if req.conversation is not None:
        return "Responses bound to a conversation do not support steering."
    if req.context_management or compaction_turn(req.input):
        return "Responses that compact their context do not support steering."
    if req.background:
        return "Background responses do not support steering."
    return None


def check_steer(message: JSON) -> tuple[str, str | list[JSON]]:
    """The target id and the input of a `response.steer` message; `invalid_input` when it
    is anything but user messages of text, image and file parts."""
    extra = sorted(set(message) - _STEER_FIELDS)
    if extra:
        raise SteerRefused(
            "invalid_input", f"Unknown field(s) {extra}: a steer carries only its input."
        )
    target = message.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRefused("invalid_input", "'previous_response_id' must name a response.")
    value = message.get("input")
    if isinstance(value, str) and value:
        return target, value
    if not isinstance(value, list) or not value:
        raise SteerRefused("invalid_input", "'input' must be a string or a non-empty array.")
    for i, item in enumerate(value):
        _check_message(item, f"input[{i}]")
    return target, value


def _check_message(item: Any, where: str) -> None:
    if not isinstance(item, dict) or item.get("role") != "user":
        raise SteerRefused("invalid_input", f"'{where}' must be a message with role 'user'.")
    if set(item) - _MESSAGE_FIELDS or item.get("type", "message") != "message":
        raise SteerRefused(
            "invalid_input", f"'{where}' may hold only 'type' ('message'), 'role' and 'content'."
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not all(
        isinstance(part, dict) and part.get("type") in _PARTS for part in content
    ):
        raise SteerRefused(
            "invalid_input",
            f"'{where}.content' must be a string or input_text, input_image and input_file parts.",
        )


def required_input(output: list[JSON]) -> list[JSON]:
    """A stub for each output the response's calls wait for from the client."""
    stubs = []
    for item in output:
        if item.get("type") in _STUBS:
            kind, keys = _STUBS[item["type"]]
            stubs.append({"type": kind, **{key: item.get(key) for key in keys}})
    return stubs


def failed_event(
    code: str, message: str, steer_input: Any, target: str, steer_id: str | None = None
) -> JSON:
    """A `response.steer.failed` for input that was not (or cannot be) committed."""
    steer: JSON = {"input": steer_input, "previous_response_id": target}
    if steer_id is not None:
        steer["id"] = steer_id
    # Not validated against the SDK's type: the input handed back may be what was wrong.
    return {
        "type": "response.steer.failed",
        "sequence_number": 0,  # it belongs to no response's stream
        "error": {"type": "invalid_request_error", "code": code, "message": message},
        "steer": steer,
    }


class SteeringDesk:
    """One connection's steering: the responses it can name and the input queued on them."""

    def __init__(self) -> None:
        self.targets: dict[str, Target] = {}
        self.parked: dict[str, list[Steer]] = {}  # waiting for the client's tool output
        self.finished: OrderedDict[str, str] = OrderedDict()  # id -> status

    def track(self, body: JSON, machine: ResponseEventMachine, unsupported: str | None) -> Target:
        """A response about to run on this connection."""
        target = Target(body, machine, unsupported)
        self.targets[target.id] = target
        return target

    def submit(self, message: JSON) -> JSON | None:
        """Queue a steer on its response (acknowledged in that response's stream: None),
        or the `response.steer.failed` event that refuses it."""
        raw_input = message.get("input")
        target_id = message.get("previous_response_id")
        try:
            self.queue(message)
        except SteerRefused as exc:
            shown = exc.shown if exc.shown is not None else _echo(raw_input)
            return failed_event(exc.code, exc.message, shown, str(target_id or ""))
        return None

    def queue(self, message: JSON) -> Steer:
        """Queue a steer on its response (acknowledged in that response's stream), or
        raise `SteerRefused`."""
        target_id, steer_input = check_steer(message)
        target = self._reachable(target_id)
        if len(target.queued) >= MAX_QUEUED:
            raise SteerRefused(
                "too_many_pending_steers",
                f"At most {MAX_QUEUED} steers may wait on one response.",
                shown=Steer("", target.id, steer_input).shown,
            )
        steer = Steer(new_id("steer"), target.id, steer_input)
        target.queued.append(steer)
        target.machine.steered = True
        target.machine.post(
            ResponseSteerAcceptedEvent,
            type="response.steer.accepted",
            steer={"id": steer.id, "previous_response_id": target.id},
        )
        return steer

    def _reachable(self, target_id: str) -> Target:
        target = self.targets.get(target_id)
        if target is not None and target.running:
            if target.unsupported is not None:
                raise SteerRefused("steering_not_supported", target.unsupported)
            return target
        status = target.machine.status if target is not None else self.finished.get(target_id)
        if status == "completed":
            raise SteerRefused(
                "response_already_completed", f"Response '{target_id}' has already completed."
            )
        if status is not None:
            raise SteerRefused(
                "response_not_active", f"Response '{target_id}' no longer takes steering input."
            )
        raise SteerRefused(
            "response_not_found", f"No response '{target_id}' is running here to steer."
        )

    def ended(self, target: Target) -> Outcome:
        """The response's stream ran out: what its queued input becomes."""
        self.targets.pop(target.id, None)
        machine = target.machine
        self.finished[target.id] = machine.status
        while len(self.finished) > MAX_REMEMBERED:
            self.finished.popitem(last=False)
        steers, target.queued = target.queued, []
        if not steers:
            return Outcome()
        if machine.status not in ("completed", "incomplete"):
            return Outcome(self._refusals(machine, steers, "response_not_active"))
        stubs = required_input(machine.output)
        if stubs:
            self.parked[target.id] = steers
            while len(self.parked) > MAX_REMEMBERED:  # never continued: let the oldest go
                self.parked.pop(next(iter(self.parked)))
            for steer in steers:
                machine.post(
                    ResponseSteerPendingEvent,
                    type="response.steer.pending",
                    reason="waiting_for_required_input",
                    required_input=stubs,
                    steer={"id": steer.id, "previous_response_id": target.id},
                )
            return Outcome([_json(event) for event in machine.notices()])
        items = [item for steer in steers for item in steer.items()]
        successor = {**target.body, "input": items, "previous_response_id": target.id}
        return Outcome(successor=successor, steers=steers)

    def unpark(self, body: JSON) -> JSON:
        """A create continuing a response that waits with queued input: that input first."""
        previous = body.get("previous_response_id")
        steers = self.parked.pop(previous, None) if isinstance(previous, str) else None
        if not steers:
            return body
        own = body.get("input")
        own_items = (
            [{"type": "message", "role": "user", "content": own}]
            if isinstance(own, str)
            else list(own or [])
        )
        return {**body, "input": [*(i for s in steers for i in s.items()), *own_items]}

    def not_committed(self, steers: list[Steer], message: str) -> list[JSON]:
        """Refusals for queued input whose successor could not be made."""
        return [
            failed_event("successor_creation_failed", message, s.shown, s.target, s.id)
            for s in steers
        ]

    def _refusals(
        self, machine: ResponseEventMachine, steers: list[Steer], code: str
    ) -> list[JSON]:
        message = (
            f"Response '{machine.id}' ended {machine.status}; its steering input was not used."
        )
        return [failed_event(code, message, s.shown, s.target, s.id) for s in steers]


def _echo(value: Any) -> str | list[JSON]:
    """Input as the refusal hands it back (a refusal of a malformed one keeps its shape)."""
    if isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(i, dict) for i in value)
    ):
        return value
    return ""


def _json(event: Any) -> JSON:
    dumped: JSON = event.model_dump(exclude_none=True)
    return dumped
