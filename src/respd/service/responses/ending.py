"""A response's events always end with a terminal event, whatever breaks on the way.

Bad requests are refused before the first event; what can still break after it (a store
that cannot save, a bug) must not cut a stream or drop a socket without a word. The client
gets `response.failed` with the server's error instead, and nothing is stored half-way."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from openai.types.responses import ResponseStreamEvent

from respd.protocol.errors import APIError
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.runner import TERMINAL_EVENTS

log = logging.getLogger(__name__)
FAILED_MESSAGE = "The server had an error while generating this response."


async def always_ended(
    events: AsyncGenerator[ResponseStreamEvent, None], machine: ResponseEventMachine
) -> AsyncGenerator[ResponseStreamEvent, None]:
    """`events`, then, if they broke before their terminal event was sent, the machine's
    `response.failed`. Closing this closes `events` (a client that went away)."""
    ended, sent = False, 0
    async with aclosing(events):
        try:
            async for event in events:
                ended = event.type in TERMINAL_EVENTS
                yield event
                sent = event.sequence_number + 1
        except Exception as exc:
            if ended or (sent == 0 and isinstance(exc, APIError)):
                raise  # over, or a refusal before any event: the transport's to answer
            log.exception("response %s failed after its first event", machine.id)
            machine.unsend(sent)
            failed = machine.fail(FAILED_MESSAGE)
        else:
            return
    for event in failed:
        yield event
