"""The flags that bound one WebSocket connection to `/v1/responses`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from respd.service.responses.socket_limits import (
    DEFAULT_ACTIVE_RESPONSES,
    DEFAULT_MAX_AGE_SECS,
    DEFAULT_STREAMS,
    SocketLimits,
)


class WebSocketConfig(BaseModel):
    model_config = ConfigDict(title="WebSocket mode")

    ws_max_active_responses: int = Field(
        DEFAULT_ACTIVE_RESPONSES,
        ge=1,
        description="Most responses one WebSocket connection may have waiting or running "
        "at once, over all its streams; one more is an error event "
        "(websocket_active_response_limit_reached, 429).",
    )
    ws_max_streams: int = Field(
        DEFAULT_STREAMS,
        ge=1,
        description="Most streams (distinct stream_id lanes, the default one included) one "
        "WebSocket connection may have busy at once; a response on one more is an error "
        "event (websocket_stream_limit_reached, 429).",
    )
    ws_max_connection_secs: float = Field(
        DEFAULT_MAX_AGE_SECS,
        gt=0,
        description="Seconds a WebSocket connection may stay open, as OpenAI's 60 minutes: "
        "then, once its responses have finished, it gets an error event "
        "(websocket_connection_limit_reached) and is closed.",
    )

    def socket_limits(self) -> SocketLimits:
        return SocketLimits(
            self.ws_max_active_responses, self.ws_max_streams, self.ws_max_connection_secs
        )
