"""Reading an upstream's answer: server-sent events batched per network read, their chunks
turned into `TokenChunk`s (text, reasoning, tool-call fragments, logprobs), usage and the
finish reason remembered for the closing `GenerationDone`, and failures mapped to the
status a client gets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from respd.engines.base import (
    CallDelta,
    FinishReason,
    GenerationDone,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
)

_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    "length": "length",
    None: "stop",
}


class UpstreamError(Exception):
    """The upstream refused or failed a request; `status` is its HTTP status (0: no
    answer at all)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _logprobs(choice: dict[str, Any]) -> list[TokenLogprob]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return [
        TokenLogprob(
            token=entry.get("token", ""),
            bytes=list(entry.get("bytes") or entry.get("token", "").encode()),
            logprob=float(entry.get("logprob", 0.0)),
            top=[
                TopLogprob(
                    t.get("token", ""),
                    list(t.get("bytes") or t.get("token", "").encode()),
                    float(t.get("logprob", 0.0)),
                )
                for t in entry.get("top_logprobs") or []
            ],
        )
        for entry in content
    ]


class StreamReader:
    """Turns the upstream's chunks into `TokenChunk`s, and remembers what the last ones
    said (finish reason, usage). With `calls_as_json`, the text is a JSON answer that
    holds the calls (see `calls_schema`): it is collected and becomes calls at the end."""

    def __init__(self, *, calls_as_json: bool = False) -> None:
        self.finish: FinishReason = "stop"
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self._calls_as_json = calls_as_json
        self._json: list[str] = []

    def flush(self) -> TokenChunk | None:
        """The calls a JSON answer held (None when there is none, or it was cut off)."""
        if not self._calls_as_json or not self._json:
            return None
        try:
            answer = json.loads("".join(self._json))
        except ValueError:
            return None  # cut off by the budget: no call to report
        calls = answer if isinstance(answer, list) else [answer]
        return TokenChunk(
            "",
            calls=[
                CallDelta(i, name=call.get("name"), arguments=json.dumps(call.get("arguments")))
                for i, call in enumerate(calls)
                if isinstance(call, dict)
            ],
            tokens=0,
        )

    def feed(self, data: dict[str, Any]) -> TokenChunk | None:
        if isinstance(data.get("error"), dict):
            raise UpstreamError(str(data["error"].get("message") or data["error"]))
        if data.get("usage"):
            self.usage = data["usage"]
        choices = data.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish = _FINISH.get(choice["finish_reason"], "stop")
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        if self._calls_as_json and text:
            self._json.append(text)
            self.chunks += 1
            text = ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        calls = [
            CallDelta(
                index=int(call.get("index", 0)),
                name=(call.get("function") or {}).get("name"),
                arguments=(call.get("function") or {}).get("arguments") or "",
            )
            for call in delta.get("tool_calls") or []
        ]
        logprobs = _logprobs(choice)
        if not (text or reasoning or calls):
            return None
        self.chunks += 1
        return TokenChunk(
            text,
            logprobs=logprobs,
            reasoning=reasoning,
            calls=calls,
            tokens=max(1, len(logprobs)),
        )

    def done(self, prompt_tokens: int) -> GenerationDone:
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        completion_details = usage.get("completion_tokens_details") or {}
        return GenerationDone(
            self.finish,
            int(usage.get("prompt_tokens") or prompt_tokens),
            int(usage.get("completion_tokens") or self.chunks),
            cached_tokens=int(details.get("cached_tokens") or 0),
            reasoning_tokens=completion_details.get("reasoning_tokens"),
        )


async def read_sse(reads: AsyncIterator[bytes]) -> AsyncIterator[list[dict[str, Any]]]:
    """The JSON payloads of a server-sent event stream, up to `[DONE]`, a batch per network
    read: when the upstream writes faster than respd reads, the tokens that piled up travel
    on as one batch instead of one event each."""
    pending = b""
    async for data in reads:
        pending += data
        *lines, pending = pending.split(b"\n")
        batch: list[dict[str, Any]] = []
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                if batch:
                    yield batch
                return
            if payload:
                batch.append(json.loads(payload))
        if batch:
            yield batch


def merge_chunks(chunks: list[TokenChunk]) -> list[TokenChunk]:
    """Consecutive chunks joined into as few as keep their order: reasoning, then text,
    then calls (the order a reader takes a chunk's parts in)."""
    merged: list[TokenChunk] = []
    for chunk in chunks:
        last = merged[-1] if merged else None
        if (
            last is None
            or (chunk.reasoning and (last.text or last.calls))
            or (chunk.text and last.calls)
        ):
            merged.append(chunk)
            continue
        last.text += chunk.text
        last.reasoning += chunk.reasoning
        last.calls += chunk.calls
        last.logprobs += chunk.logprobs
        last.tokens = last.n_tokens + chunk.n_tokens
    return merged


def error_status(exc: Exception) -> int:
    """The status a client gets for an upstream failure: the upstream's own 4xx passes
    through; a timeout is 504; anything else (its 5xx, a refused or broken connection, a
    garbled stream) is 502."""
    if isinstance(exc, UpstreamError) and 400 <= exc.status < 500:
        return exc.status
    if isinstance(exc, httpx.TimeoutException):
        return 504
    return 502


def failure(exc: Exception) -> tuple[str, int]:
    """What a client gets for an upstream failure: the message and `error_status`. The
    upstream's own refusal reads as it wrote it; anything else says the upstream failed."""
    status = error_status(exc)
    return (str(exc) if status < 500 else f"The upstream engine failed: {exc}"), status


def error_message(text: str) -> str:
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    except (ValueError, AttributeError):
        pass
    return text[:500] or "no body"
