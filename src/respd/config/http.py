"""The HTTP server's flags: where it listens, whom it answers, how connections are run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from respd.config.lists import comma_separated


class HttpConfig(BaseModel):
    model_config = ConfigDict(title="HTTP server")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on.")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header values accepted (comma-separated; '*' any), against DNS "
        "rebinding. Default: loopback names and addresses when bound to a loopback address, "
        "else any.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web origins (scheme://host[:port], comma-separated; '*' any) whose pages "
        "may call the API: they get CORS headers and preflight answers. A request from any "
        "other origin is refused with 403. Default: none.",
    )
    no_ui: bool = Field(
        False,
        description="Do not serve the web playground at / (the API is unchanged; / then "
        "answers 404).",
    )
    sse_keepalive_secs: float = Field(
        15.0,
        ge=0.0,
        description="Send an SSE ': keep-alive' comment after this many quiet seconds on a "
        "stream (e.g. while a request waits for a slot); 0 disables.",
    )
    shutdown_grace_secs: float = Field(
        30.0,
        ge=0.0,
        description="On SIGTERM/SIGINT: seconds running generations may take to finish before "
        "they are ended as incomplete (each client still gets its terminal event); new "
        "requests get a 503 meanwhile. The process then exits 0.",
    )
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        "auto",
        description="HTTP/1.1 parser: httptools (C; least Python per streamed frame), h11 "
        "(pure Python), or auto (httptools where installed).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="Event loop: uvloop (libuv; cheaper wake-ups and socket writes for many "
        "streams), asyncio, or auto (uvloop where installed).",
    )
    header_timeout_secs: float = Field(
        10.0,
        ge=0.0,
        description="Seconds a connection may take to send a complete request line and "
        "headers (from opening, or from the first byte of its next request) before it is "
        "closed, so clients that connect and stall cannot hold sockets open. 0: no limit.",
    )
    body_timeout_secs: float = Field(
        30.0,
        ge=0.0,
        description="Seconds a request body may take once its headers are in; a body still "
        "coming is given another period each time it brought at least --min-upload-rate "
        "bytes a second over the last one. Otherwise the client gets a 408 and the "
        "connection is closed. 0: no limit.",
    )
    min_upload_rate: int = Field(
        1024,
        ge=0,
        description="Bytes a second a request body must keep arriving at to outlast "
        "--body-timeout-secs (so large uploads on a working link finish, trickles do not). "
        "0: every body must be complete within --body-timeout-secs.",
    )

    @field_validator("allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _comma_separated_names(cls, value: object) -> object:
        return comma_separated(value)
