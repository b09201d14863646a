"""WebSocket mode from the `openai` SDK's side: one turn on a `responses.connect()` socket."""

from __future__ import annotations

from typing import Any

# The events that end one response on a socket (an `error` ends a refused create).
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def turn(conn: Any, model: str, **body: Any) -> list[Any]:
    """Send one `response.create` and read its events through the terminal one."""
    conn.send({"type": "response.create", "model": model, **body})
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the socket closed before a terminal event")
