"""What one WebSocket connection may hold, apart from the session that enforces it (the
settings read these without loading the Responses machinery)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ACTIVE_RESPONSES = 16
DEFAULT_STREAMS = 16
DEFAULT_MAX_AGE_SECS = 3600.0


@dataclass(frozen=True)
class SocketLimits:
    """What one socket may hold: responses waiting or running, busy lanes, and its age
    in seconds."""

    active_responses: int = DEFAULT_ACTIVE_RESPONSES
    streams: int = DEFAULT_STREAMS
    max_age: float = DEFAULT_MAX_AGE_SECS
