"""Incremental reading of generated text into message text and function calls.

The parser is fed token text as it arrives and answers at once with what it now knows:
text that cannot be part of a call marker, the start of a call (as soon as its name is
complete), argument text as it is generated, and the end of a call. Markers split across
deltas are held back only until the next delta decides them; nothing waits for the end of
the generation.

All supported families write a call as a JSON object `{"name": …, "arguments"|"parameters":
…}`; they differ in the markers around it (see `engines/families/tools.py`). A call to a
function that was not offered, or an object with no name, is given back as plain text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from respd.engines.families.tools import ToolFormat
from respd.service.generation.output import ArgumentsDelta, CallFinished, CallStarted, TextDelta

ARGS_KEYS = ("arguments", "parameters")


ParseEvent = TextDelta | CallStarted | ArgumentsDelta | CallFinished


class _ObjectScanner:
    """Follows one JSON object character by character and locates its top-level values."""

    def __init__(self) -> None:
        self.raw = ""
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.expect = "key"  # at depth 1: key | colon | value | comma
        self.key: str | None = None
        self.key_start = -1
        self.value_start = -1
        self.value_kind: str | None = None  # container | string | scalar
        self.name: str | None = None
        self.args_start = -1
        self.args_end = -1
        self.args_is_string = False
        self.done = False

    def feed(self, text: str) -> int:
        """Consume characters up to the end of the object; return how many were used."""
        for n, c in enumerate(text):
            i = len(self.raw)
            self.raw += c
            self._step(c, i)
            if self.done:
                return n + 1
        return len(text)

    def _step(self, c: str, i: int) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                if self.depth == 1:
                    if self.expect == "key":
                        key = _loads(self.raw[self.key_start : i + 1])
                        self.key = key if isinstance(key, str) else None
                        self.expect = "colon"
                    elif self.value_kind == "string":
                        self._end_value(i + 1)
            return
        if c == '"':
            self.in_str = True
            if self.depth == 1:
                if self.expect == "key":
                    self.key_start = i
                elif self.expect == "value" and self.value_start < 0:
                    self._begin_value(i, "string")
        elif c in "{[":
            if self.depth == 1 and self.expect == "value" and self.value_start < 0:
                self._begin_value(i, "container")
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 1 and self.value_kind == "container":
                self._end_value(i + 1)
            elif self.depth <= 0:
                if self.value_kind == "scalar":
                    self._end_value(i)
                self.done = True
        elif self.depth == 1:
            if c == ":" and self.expect == "colon":
                self.expect = "value"
            elif c == ",":
                if self.value_kind == "scalar":
                    self._end_value(i)
                self.expect = "key"
            elif not c.isspace() and self.expect == "value" and self.value_start < 0:
                self._begin_value(i, "scalar")

    def _begin_value(self, i: int, kind: str) -> None:
        self.value_start, self.value_kind = i, kind
        if self.key in ARGS_KEYS and self.args_start < 0:
            self.args_start, self.args_is_string = i, kind == "string"

    def _end_value(self, end: int) -> None:
        value = self.raw[self.value_start : end].strip()
        # The first name decides: a stream starts the call before a later one could arrive.
        if self.key == "name" and self.value_kind == "string" and self.name is None:
            name = _loads(value)
            self.name = name if isinstance(name, str) else None
        if self.key in ARGS_KEYS and self.args_start == self.value_start:
            self.args_end = end
        self.value_start, self.value_kind, self.expect = -1, None, "comma"

    def arguments(self) -> str:
        """The final arguments text: the raw object, or the decoded string-encoded form."""
        if self.args_start < 0:
            return "{}"
        end = self.args_end if self.args_end >= 0 else len(self.raw)
        text = self.raw[self.args_start : end]
        if self.args_is_string:
            decoded = _loads(text)
            return decoded if isinstance(decoded, str) else text
        return text


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolCallParser:
    """Splits one generation into text and calls for a `ToolFormat`.

    `names`: the functions a call may name (others are text); `max_calls`: calls beyond it
    are read and dropped (`parallel_tool_calls: false` is a cap of 1).
    """

    def __init__(
        self, fmt: ToolFormat, names: set[str] | None = None, max_calls: int | None = None
    ) -> None:
        self.fmt = fmt
        self.names = names
        self.max_calls = max_calls
        self.calls = 0
        self._state = "start" if fmt.bare_json else "text"
        self._pending = ""  # text held back: a possible marker, or trailing whitespace
        self._prefix = ""  # markers consumed since the last text, given back on rejection
        self._scanner: _ObjectScanner | None = None
        self._started = False
        self._discard = False
        self._emitted = 0  # end of the argument text already sent
        self._fed = 0  # characters fed so far

    @property
    def saw_call(self) -> bool:
        return self.calls > 0

    def feed(self, text: str, tokens: int = 0) -> list[ParseEvent]:
        """`tokens`: how many tokens produced `text` (the reasoning reader's interface; the
        tool parser does not need it)."""
        out: list[ParseEvent] = []
        self._pending += text
        self._fed += len(text)
        self._advance(out)
        return out

    def _at(self) -> int:
        """Offset of `_pending`'s first character in everything fed (it is always a suffix)."""
        return self._fed - len(self._pending)

    def finish(self) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        if self._state == "call" and self._scanner is not None:
            if self._started or not self._prefix.strip():
                self._finish_call(out, complete=False)
            # else: cut off inside a marked call before its name: nothing usable to report
        elif self._state == "between":
            rest = self._pending.strip()
            if rest and not self._only_fillers(rest):
                out.append(TextDelta(self._pending, self._at()))
        elif self._pending:
            out.append(TextDelta(self._pending, self._at()))
        self._pending = ""
        return _merge_text(out)

    # -- states ----------------------------------------------------------------------------

    def _advance(self, out: list[ParseEvent]) -> None:
        while self._pending:
            before = (self._state, len(self._pending))
            if self._state == "plain":
                out.append(TextDelta(self._pending, self._at()))
                self._pending = ""
            elif self._state == "start":
                stripped = self._pending.lstrip()
                if not stripped:
                    return
                self._state = "call_open" if stripped[0] == "{" else "text"
                if self._state == "call_open":
                    self._prefix, self._pending = self._pending[: -len(stripped)], stripped
            elif self._state == "text":
                self._text(out)
            elif self._state == "between":
                self._between(out)
            elif self._state == "call_open":
                self._open_call()
            elif self._state == "call":
                self._call(out)
            if (self._state, len(self._pending)) == before:
                return  # waiting for more text

    def _text(self, out: list[ParseEvent]) -> None:
        buf = self._pending
        hits = [(buf.find(t), t) for t in self.fmt.triggers if t in buf]
        if hits:
            at, trigger = min(hits)
            head = buf[:at]
            body = head.rstrip()
            self._emit_text(out, body)
            self._prefix = head[len(body) :] + trigger
            self._pending = buf[at + len(trigger) :]
            self._state = "between"
            return
        keep = partial_suffix(buf, self.fmt.triggers)
        body = buf[: len(buf) - keep]
        # Trailing whitespace is held too: if a call follows, it must not make a message.
        ws = len(body) - len(body.rstrip())
        self._emit_text(out, body[: len(body) - ws])
        self._pending = buf[len(body) - ws :]

    def _emit_text(self, out: list[ParseEvent], text: str) -> None:
        if text.strip():  # `text` always begins `_pending`
            out.append(TextDelta(text, self._at()))

    def _between(self, out: list[ParseEvent]) -> None:
        buf = self._pending
        while True:
            stripped = buf.lstrip()
            self._prefix += buf[: len(buf) - len(stripped)]
            buf = stripped
            if any(len(f) > len(buf) and f.startswith(buf) for f in self.fmt.fillers):
                break  # a longer filler may be arriving (`[TOOL_CALLS]` after `[`): wait
            filler = next((f for f in self.fmt.fillers if buf.startswith(f)), None)
            if filler is None:
                break
            self._prefix += filler
            buf = buf[len(filler) :]
        self._pending = buf
        if not buf:
            return
        if buf[0] == "{":
            self._state = "call_open"
        elif not any(f.startswith(buf) for f in self.fmt.fillers):
            self._state = "text"  # prose after the calls

    def _open_call(self) -> None:
        self._scanner = _ObjectScanner()
        self._started = False
        self._discard = self.max_calls is not None and self.calls >= self.max_calls
        self._emitted = 0
        self._state = "call"

    def _call(self, out: list[ParseEvent]) -> None:
        sc = self._scanner
        assert sc is not None
        used = sc.feed(self._pending)
        self._pending = self._pending[used:]
        if not self._started and sc.name is not None:
            if self.names is not None and sc.name not in self.names:
                self._reject(out)
                return
            self._started = True
            if not self._discard:
                out.append(CallStarted(self.calls, sc.name))
        if self._started and not sc.args_is_string and sc.args_start >= 0:
            end = sc.args_end if sc.args_end >= 0 else len(sc.raw)
            start = max(self._emitted, sc.args_start)
            if end > start and not self._discard:
                out.append(ArgumentsDelta(self.calls, sc.raw[start:end]))
            self._emitted = max(self._emitted, end)
        if sc.done:
            if not self._started:
                self._reject(out)
                return
            self._finish_call(out, complete=True)

    def _finish_call(self, out: list[ParseEvent], *, complete: bool) -> None:
        sc = self._scanner
        assert sc is not None
        if not self._started:
            self._reject(out)
            self._state = "plain"
            return
        args = sc.arguments()
        if not self._discard:
            streamed = sc.raw[sc.args_start : self._emitted] if sc.args_start >= 0 else ""
            if sc.args_is_string or sc.args_start < 0:
                streamed = ""
            if args != streamed and args.startswith(streamed):
                out.append(ArgumentsDelta(self.calls, args[len(streamed) :]))
            out.append(CallFinished(self.calls, sc.name or "", args, complete))
            self.calls += 1
        self._scanner = None
        self._prefix = ""
        self._state = "between"

    def _reject(self, out: list[ParseEvent]) -> None:
        """Not a call after all: everything read since the last text is text."""
        sc = self._scanner
        raw = sc.raw if sc is not None else ""
        text = self._prefix + raw  # everything read since the last text, up to `_pending`
        out.append(TextDelta(text, self._at() - len(text)))
        self._prefix = ""
        self._scanner = None
        self._state = "plain"

    def _only_fillers(self, text: str) -> bool:
        while text:
            text = text.lstrip()
            f = next((f for f in self.fmt.fillers if text.startswith(f)), None)
            if f is None:
                return not text or any(f.startswith(text) for f in self.fmt.fillers)
            text = text[len(f) :]
        return True


def partial_suffix(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest end of `buf` that could begin one of `markers`."""
    keep = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(buf)), 0, -1):
            if buf.endswith(m[:n]):
                keep = max(keep, n)
                break
    return keep


def _merge_text(events: list[ParseEvent]) -> list[ParseEvent]:
    return [e for e in events if not (isinstance(e, TextDelta) and not e.text)]
