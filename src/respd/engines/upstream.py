"""A message-level engine: any OpenAI-compatible Chat Completions server (vLLM, SGLang,
llama.cpp's llama-server, another respd, a hosted API) behind respd's stateful layer.

Each generation is one streaming `POST /v1/chat/completions`: the conversation's messages,
the offered tools with a `tool_choice` for forced calls, a JSON-Schema answer as
`response_format`, and the sampling settings. The stream's text, reasoning
(`reasoning_content` or `reasoning`) and tool-call deltas come back as `TokenChunk`s the
generation core reads like any engine's; usage comes from the final usage chunk. All
requests share one pooled `httpx.AsyncClient`. Closing a stream closes its HTTP response,
which cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from respd.engines.base import (
    Admitted,
    CallDelta,
    ChatMessage,
    EngineBusy,
    EngineStats,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationStream,
    Prompt,
    PromptRequest,
    PromptTooLong,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
)
from respd.engines.constraints import (
    NO_PARAMETERS,
    CallsConstraint,
    Constraint,
    ConstraintError,
    check_schema,
)
from respd.engines.families.profile import STRUCTURED

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 32768
DEFAULT_MAX_CONCURRENCY = 64
# A rough prompt size for fitting and for `n_tokens` before the upstream reports usage.
CHARS_PER_TOKEN = 4
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


def _estimate(messages: list[ChatMessage]) -> int:
    chars = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
    return chars // CHARS_PER_TOKEN + 4 * len(messages)


def wire_message(message: ChatMessage) -> dict[str, Any]:
    """A conversation turn in Chat Completions' shape (images as data-URI parts)."""
    out: dict[str, Any] = {"role": message.role}
    if message.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
        for image in message.images:
            data = base64.b64encode(image.data).decode()
            url = f"data:{image.mime_type};base64,{data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        out["content"] = parts
    else:
        out["content"] = message.content
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    return out


def calls_schema(calls: CallsConstraint) -> dict[str, Any]:
    """A JSON Schema whose instances are calls to `calls.tools`: `{"name", "arguments"}`,
    or an array of them when more than one call is allowed."""
    one = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.name]},
                    "arguments": tool.parameters or NO_PARAMETERS,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in calls.tools
        ]
    }
    if calls.max_calls == 1:
        return one
    array: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    if calls.max_calls is not None:
        array["maxItems"] = calls.max_calls
    return array


def _calls_instruction(calls: CallsConstraint) -> ChatMessage:
    described = "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
        for t in calls.tools
    )
    return ChatMessage(
        "system",
        "Call a function: answer with JSON naming the function (`name`) and its `arguments`. "
        f"The functions:\n{described}",
    )


def _schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def request_body(
    model: str, prompt: Prompt, params: SamplingParams, *, emulate_calls: bool = False
) -> dict[str, Any]:
    """The `/v1/chat/completions` body for one generation. With `emulate_calls`, forced
    calls are asked for as a JSON-Schema answer (for an upstream that enforces schemas but
    cannot force tools)."""
    request = prompt.request
    constraint: Constraint | None = prompt.compiled
    calls = constraint.calls if constraint is not None else None
    emulated = emulate_calls and calls is not None
    messages = list(prompt.messages)
    if emulated and calls is not None:
        messages.insert(0, _calls_instruction(calls))
    body: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if emulated and calls is not None:
        body["response_format"] = _schema_format("calls", calls_schema(calls))
    else:
        if request.tools:
            body["tools"] = [t.as_template_tool() for t in request.tools]
        if constraint is not None and calls is not None:
            if constraint.forced_calls and len(calls.tools) == 1:
                name = calls.tools[0].name
                body["tool_choice"] = {"type": "function", "function": {"name": name}}
            elif constraint.forced_calls:
                body["tool_choice"] = "required"
            if calls.max_calls == 1:
                body["parallel_tool_calls"] = False
        if constraint is not None and constraint.answer is not None:
            body["response_format"] = _schema_format("answer", constraint.answer)
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "max_tokens": params.max_tokens,
        "presence_penalty": params.presence_penalty or None,
        "frequency_penalty": params.frequency_penalty or None,
        "stop": params.stop or None,
        # Extensions vLLM and llama-server read under these names; sent only when set.
        "ignore_eos": params.ignore_eos or None,
        "min_tokens": params.min_tokens or None,
    }
    body.update({k: v for k, v in sampling.items() if v is not None})
    if params.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias.items()}
    if params.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = params.logprobs
    return body


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


class _UpstreamStream:
    def __init__(self, engine: UpstreamEngine, prompt: Prompt, params: SamplingParams) -> None:
        self._engine = engine
        self._events = self._run(prompt, params)

    def __aiter__(self) -> _UpstreamStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        return await self._events.__anext__()

    def cancel(self) -> None:
        pass  # closing the stream closes the HTTP response

    async def aclose(self) -> None:
        await self._events.aclose()

    async def _run(
        self, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        engine = self._engine
        stats = engine._stats
        emulate = engine.emulates_calls(prompt.compiled)
        body = request_body(engine.upstream_model, prompt, params, emulate_calls=emulate)
        reader = StreamReader(calls_as_json=emulate)
        finished = False
        stats.running += 1
        try:
            yield Admitted()
            async with engine.http.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode(errors="replace")
                    raise UpstreamError(_error_message(text), response.status_code)
                engine.healthy = True
                async for batch in read_sse(response.aiter_bytes()):
                    fed = [reader.feed(data) for data in batch]
                    for chunk in merge_chunks([c for c in fed if c is not None]):
                        stats.generated_tokens += chunk.n_tokens
                        yield chunk
            calls = reader.flush()
            if calls is not None:
                yield calls
            done = reader.done(prompt.n_tokens)
            stats.prompt_tokens += done.prompt_tokens
            stats.cached_tokens += done.cached_tokens
            stats.completed += 1
            finished = True
            yield done
        except (httpx.HTTPError, UpstreamError, ValueError) as exc:
            stats.failed += 1
            finished = True
            if isinstance(exc, httpx.TransportError):
                engine.healthy = False
                engine.problem = f"{type(exc).__name__}: {exc}"
            log.warning("upstream request failed: %s", exc)
            status = error_status(exc)
            refused = 400 <= status < 500
            yield GenerationDone(
                "error",
                prompt.n_tokens,
                reader.chunks,
                error=str(exc) if refused else f"The upstream engine failed: {exc}",
                status=status,
            )
        finally:
            stats.running -= 1
            if not finished:
                stats.cancelled += 1


def error_status(exc: Exception) -> int:
    """The status a client gets for an upstream failure: the upstream's own 4xx passes
    through; a timeout is 504; anything else (its 5xx, a refused or broken connection, a
    garbled stream) is 502."""
    if isinstance(exc, UpstreamError) and 400 <= exc.status < 500:
        return exc.status
    if isinstance(exc, httpx.TimeoutException):
        return 504
    return 502


def _error_message(text: str) -> str:
    try:
        error = json.loads(text).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    except (ValueError, AttributeError):
        pass
    return text[:500] or "no body"


OPTIONS = ("model", "key", "ctx", "vision", "tool_choice", "response_format")


def _flag(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class UpstreamSpec:
    """Where one upstream model lives and what respd calls it."""

    url: str
    alias: str | None = None
    model: str | None = None
    api_key: str | None = None
    context_window: int | None = None
    vision: bool = False
    # What the upstream can enforce: a forced `tool_choice`, a `response_format` schema.
    forces_tools: bool = True
    enforces_schemas: bool = True

    @classmethod
    def parse(cls, text: str) -> UpstreamSpec:
        """`ALIAS=URL[,model=NAME][,key=KEY][,ctx=TOKENS][,vision=true][,tool_choice=false]
        [,response_format=false]`."""
        head, *options = [p.strip() for p in text.split(",")]
        alias, eq, url = head.partition("=")
        if not eq or not alias or not url.startswith(("http://", "https://")):
            raise ValueError("expected ALIAS=http(s)://HOST[:PORT]/v1 first")
        fields: dict[str, str] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or key not in OPTIONS:
                raise ValueError(f"unknown option {option!r} ({', '.join(OPTIONS)})")
            fields[key] = value
        ctx = fields.get("ctx")
        if ctx is not None and not (ctx.isdigit() and int(ctx) > 0):
            raise ValueError(f"ctx must be a positive number of tokens, not {ctx!r}")
        return cls(
            url,
            alias=alias,
            model=fields.get("model"),
            api_key=fields.get("key"),
            context_window=int(ctx) if ctx else None,
            vision=_flag(fields.get("vision", "false")),
            forces_tools=_flag(fields.get("tool_choice", "true")),
            enforces_schemas=_flag(fields.get("response_format", "true")),
        )


class UpstreamEngine:
    """One model served by an OpenAI-compatible server at `base_url` (ending in `/v1`)."""

    def __init__(
        self,
        base_url: str,
        *,
        model_id: str,
        upstream_model: str | None = None,
        api_key: str | None = None,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        vision: bool = False,
        forces_tools: bool = True,
        enforces_schemas: bool = True,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        timeout: float = 600.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.model_id = model_id
        self.upstream_model = upstream_model or model_id
        self.context_window = context_window
        self.vision = vision
        self.forces_tools = forces_tools
        self.enforces_schemas = enforces_schemas
        self.profile = STRUCTURED
        self.default_sampling: dict[str, float] = {}  # the upstream applies its own
        self.n_vocab: int | None = None
        self.max_concurrency = max_concurrency
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._base_url = base_url.rstrip("/")
        self._headers = headers
        self._timeout = timeout
        self._http = http
        self._stats = EngineStats()
        self.healthy = True
        self.problem: str | None = None
        self._closing: asyncio.Task[None] | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        # Created on first use, inside the serving event loop.
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self._base_url,
                headers=self._headers,
                timeout=httpx.Timeout(self._timeout, connect=10.0),
                limits=httpx.Limits(max_connections=self.max_concurrency),
            )
        return self._http

    def check_schema(self, schema: dict[str, Any]) -> None:
        check_schema(schema)

    async def prepare(self, request: PromptRequest) -> Prompt:
        constraint = request.constraint
        # What the upstream cannot enforce is refused, never passed on and hoped for; forced
        # calls can still be asked for as a schema answer when it enforces schemas.
        if (
            constraint is not None
            and constraint.forced_calls
            and not self.forces_tools
            and not self.enforces_schemas
        ):
            raise ConstraintError(
                f"the upstream serving {self.model_id} cannot force tool calls", "calls"
            )
        if constraint is not None and constraint.answer is not None and not self.enforces_schemas:
            raise ConstraintError(
                f"the upstream serving {self.model_id} cannot enforce a JSON Schema", "answer"
            )
        messages = list(request.messages)
        budget = self.context_window - request.reserve
        n_tokens = _estimate(messages)
        if n_tokens > budget and request.truncate:
            # Drop the oldest non-system turns until the estimate fits.
            while n_tokens > budget and any(m.role != "system" for m in messages[:-1]):
                first = next(i for i, m in enumerate(messages) if m.role != "system")
                del messages[first]
                n_tokens = _estimate(messages)
        if n_tokens > budget:
            raise PromptTooLong(
                n_tokens, self.context_window, request.reserve, truncated=request.truncate
            )
        return Prompt(request, messages, n_tokens, compiled=request.constraint)

    def emulates_calls(self, constraint: Constraint | None) -> bool:
        """Forced calls go to this upstream as a JSON-Schema answer."""
        forced = constraint is not None and constraint.forced_calls
        return forced and not self.forces_tools and self.enforces_schemas

    def generate(
        self, prompt: Prompt, params: SamplingParams, *, cache_key: str | None = None
    ) -> GenerationStream:
        if self._stats.running >= self.max_concurrency:
            raise EngineBusy(f"all {self.max_concurrency} upstream connections are busy")
        return _UpstreamStream(self, prompt, params)

    def stats(self) -> EngineStats:
        self._stats.healthy = self.healthy
        self._stats.problem = self.problem
        return self._stats

    async def probe(self) -> bool:
        """Ask the upstream for its models: reachable or not (for /health)."""
        try:
            r = await self.http.get("/models", timeout=5)
            self.healthy = r.status_code < 500
            self.problem = None if self.healthy else f"upstream answered {r.status_code}"
        except httpx.HTTPError as exc:
            self.healthy = False
            self.problem = f"{type(exc).__name__}: {exc}"
        return self.healthy

    def close(self) -> None:
        if self._http is not None:
            client, self._http = self._http, None
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # the loop is gone, and its connections with it
            self._closing = loop.create_task(client.aclose())
