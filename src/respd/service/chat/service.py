"""`POST /v1/chat/completions` as an adapter over the generation core: `messages` become a
`GenerationSpec`; the core's events become content, reasoning and tool-call deltas and one
final `ChatResult`, and those the completion, or the chunks of its stream in order."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from respd.engines.base import TokenLogprob, ToolCall
from respd.engines.route import RouteReport
from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.errors import APIError, InvalidRequest, ServerError, Unsupported, UpstreamFailed
from respd.service.chat.translate import chat_messages
from respd.service.generation import core
from respd.service.generation.core import GenerationSpec, Params, PreparedGeneration
from respd.service.generation.logprobs import check_top_logprobs, logprob_json
from respd.service.generation.output import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    Finished,
    ReasoningDelta,
    TextDelta,
)
from respd.service.generation.prompt_cache import prompt_cache
from respd.service.generation.routing import route_of
from respd.service.generation.sampling import build_sampling
from respd.service.generation.structured import chat_answer_schema
from respd.service.ids import new_id
from respd.service.media.lowering import Lowering, require_effective_input
from respd.service.metadata import check_metadata
from respd.service.shared import Shared
from respd.service.tools.definitions import chat_tool_choice, chat_tools

MAX_STOP_SEQUENCES = 4


@dataclass
class PreparedChat:
    request: ChatCompletionRequest
    generation: PreparedGeneration
    include_usage: bool
    id: str = field(default_factory=lambda: "chatcmpl-" + new_id("c")[2:])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model(self) -> str:
        return self.generation.engine.model_id


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: the first carries id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def as_delta(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"arguments": self.arguments}
        out: dict[str, Any] = {"index": self.index, "function": fn}
        if self.id is not None:
            out.update(id=self.id, type="function")
            fn["name"] = self.name
        return {"tool_calls": [out]}


@dataclass
class ContentDelta:
    """Message text, with the logprobs of the tokens it completes (None: not requested)."""

    text: str
    logprobs: list[TokenLogprob] | None = None


@dataclass
class ChatResult:
    text: str = ""
    reasoning: str = ""  # `reasoning_content`
    logprobs: list[TokenLogprob] | None = None  # set when the request asked for logprobs
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    error: str | None = None  # the generation failed: what the client is told
    error_code: str = "server_error"
    status: int | None = None  # a remote engine's failure: the HTTP status it maps to
    route: RouteReport | None = None  # which provider of a routed model answered


@dataclass
class TextChunk:
    """A chunk whose delta is this content text alone (`ChatService.text_chunk`): the bulk
    of a stream, one per token, left to the transport to frame as it finds cheapest."""

    text: str


ChatDelta = ContentDelta | ToolCallDelta | ReasoningDelta
# A stream's pieces in order: chunks, plain text chunks, and its error's body, which ends it.
ChatStreamItem = ChatCompletionChunk | TextChunk | dict[str, Any]
FAILED = "The model failed while generating this completion."
SHUT_DOWN = "The server shut down before this completion finished."


def chat_error(result: ChatResult) -> APIError:
    """The error of a failed generation: an upstream engine's keeps its status."""
    if result.status is not None:
        return UpstreamFailed(result.error or "", result.status)
    status = 503 if result.error_code == "server_shutting_down" else 500
    return ServerError(result.error or "", code=result.error_code, status_code=status)


def _message(result: ChatResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning  # the vLLM / llama-server field
    if result.tool_calls:
        message["content"] = result.text or None
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in result.tool_calls
        ]
    return message


class ChatService:
    def __init__(self, shared: Shared) -> None:
        self.models = shared.models
        self.media = shared.media
        self.runs = shared.runs
        self.limits = shared.limits

    async def prepare(self, req: ChatCompletionRequest, owner: str = "") -> PreparedChat:
        self.limits.check(req.messages, None, req.tools, items_param="messages")
        self.limits.check_max_tokens(req.max_tokens, "max_tokens")
        self.limits.check_max_tokens(req.max_completion_tokens, "max_completion_tokens")
        engine = await self.models.ready(req.model)
        check_metadata(req.metadata)
        cache = prompt_cache(req.prompt_cache_key, req.prompt_cache_retention)
        if req.n not in (None, 1):
            raise Unsupported("Only n=1 is supported.", param="n")
        tools = chat_tools(req.tools, engine.check_schema)
        policy = replace(
            chat_tool_choice(req.tool_choice, tools), parallel=req.parallel_tool_calls is not False
        )
        check_top_logprobs(req.top_logprobs)
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequest(
                "Invalid 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.",
                param="top_logprobs",
                code="invalid_value",
            )
        use_completion = req.max_completion_tokens is not None
        sampling = build_sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_completion_tokens if use_completion else req.max_tokens,
            max_tokens_param="max_completion_tokens" if use_completion else "max_tokens",
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            logit_bias=req.logit_bias,
            n_vocab=engine.n_vocab,
            dry=req,
        )
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(
                f"Invalid 'stop': at most {MAX_STOP_SEQUENCES} sequences are allowed.",
                param="stop",
                code="invalid_value",
            )
        sampling.stop = stops
        sampling.logprobs = (req.top_logprobs or 0) if req.logprobs else None
        answer = chat_answer_schema(req.response_format, engine.check_schema)
        media = await self.media.resolve_messages(req.messages, owner) if self.media else {}
        low = Lowering.for_engine(engine, media, self.media.settings if self.media else None)
        messages = chat_messages(req.messages, low)
        require_effective_input(messages, param="messages")
        spec = GenerationSpec(
            messages=messages,
            sampling=sampling,
            tools=tools,
            policy=policy,
            answer_schema=answer,
            reasoning_effort=req.reasoning_effort,
            cache_key=cache.key or req.user,
            retain=cache.retain,
            params=Params(
                messages="messages",
                answer="response_format",
                max_tokens="max_completion_tokens" if use_completion else "max_tokens",
            ),
            route=route_of(req.provider),
        )
        generation = await core.prepare(engine, spec)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return PreparedChat(req, generation, include_usage)

    def generate(self, prepared: PreparedChat) -> AsyncGenerator[ChatDelta | ChatResult, None]:
        """Admit the generation now (503 when the engine is full), then yield text,
        reasoning and tool-call deltas and one final `ChatResult` (whose `error` is set when
        the generation failed); closing early cancels the generation."""
        return self._stream(prepared, core.run(prepared.generation, self.runs))

    async def _stream(
        self, prepared: PreparedChat, generation: core.Run
    ) -> AsyncGenerator[ChatDelta | ChatResult, None]:
        result = ChatResult(prompt_tokens=prepared.generation.prompt_tokens)
        if prepared.generation.spec.sampling.logprobs is not None:
            result.logprobs = []
        async with aclosing(generation):
            async for event in generation:
                if isinstance(event, Finished):
                    _finish(result, event)
                    yield result
                elif isinstance(event, TextDelta):
                    result.text += event.text
                    if result.logprobs is not None:
                        result.logprobs += event.logprobs or []
                    yield ContentDelta(event.text, event.logprobs)
                elif isinstance(event, ReasoningDelta):
                    result.reasoning += event.text
                    yield event
                elif isinstance(event, CallStarted):
                    call = ToolCall("call_" + new_id("c")[2:26], event.name, "")
                    result.tool_calls.append(call)
                    yield ToolCallDelta(event.index, id=call.id, name=event.name)
                elif isinstance(event, ArgumentsDelta):
                    result.tool_calls[event.index].arguments += event.delta
                    yield ToolCallDelta(event.index, arguments=event.delta)
                elif isinstance(event, CallFinished):
                    result.tool_calls[event.index].arguments = event.arguments

    async def complete(self, prepared: PreparedChat) -> ChatCompletion:
        """Admit and run the generation to its end: the completion, or its error raised."""
        result = ChatResult()
        async for item in self.generate(prepared):
            if isinstance(item, ChatResult):
                result = item
        if result.error is not None:
            raise chat_error(result)
        return self.completion(prepared, result)

    def stream(self, prepared: PreparedChat) -> AsyncGenerator[ChatStreamItem, None]:
        """Admit the generation now (503 when the engine is full), then yield the stream's
        chunks: the assistant's role first, the deltas, the finish (and usage, when asked
        for); a failure once begun is the last item, as OpenAI sends it. Closing early
        cancels the generation."""
        return self._chunks(prepared, self.generate(prepared))

    async def _chunks(
        self, prepared: PreparedChat, stream: AsyncGenerator[ChatDelta | ChatResult, None]
    ) -> AsyncGenerator[ChatStreamItem, None]:
        yield self.chunk(prepared, delta={"role": "assistant", "content": ""})
        async with aclosing(stream):
            async for item in stream:
                if isinstance(item, ChatResult) and item.error is not None:
                    yield chat_error(item).body()
                elif isinstance(item, ChatResult):
                    yield self.chunk(
                        prepared, delta={}, finish_reason=item.finish_reason, route=item.route
                    )
                    if prepared.include_usage:
                        yield self.chunk(prepared, usage=self.usage(item))
                elif isinstance(item, ToolCallDelta):
                    yield self.chunk(prepared, delta=item.as_delta())
                elif isinstance(item, ReasoningDelta):
                    delta = {"reasoning_content": item.text}  # the vLLM / llama-server field
                    yield self.chunk(prepared, delta=delta)
                elif item.logprobs is None:
                    yield TextChunk(item.text)
                else:
                    yield self.chunk(prepared, delta={"content": item.text}, logprobs=item.logprobs)

    def text_chunk(self, prepared: PreparedChat, text: str) -> ChatCompletionChunk:
        """The chunk a `TextChunk` stands for."""
        return self.chunk(prepared, delta={"content": text})

    def usage(self, result: ChatResult) -> dict[str, Any]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
        }

    def completion(self, prepared: PreparedChat, result: ChatResult) -> ChatCompletion:
        routed = {"provider": result.route.wire()} if result.route is not None else {}
        return ChatCompletion.model_validate(
            {
                **routed,
                "id": prepared.id,
                "object": "chat.completion",
                "created": prepared.created,
                "model": prepared.model,
                "choices": [
                    {
                        "index": 0,
                        "message": _message(result),
                        "finish_reason": result.finish_reason,
                        "logprobs": _choice_logprobs(result.logprobs),
                    }
                ],
                "usage": self.usage(result),
                "system_fingerprint": None,
            }
        )

    def chunk(
        self,
        prepared: PreparedChat,
        *,
        delta: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
        logprobs: list[TokenLogprob] | None = None,
        route: RouteReport | None = None,
    ) -> ChatCompletionChunk:
        body: dict[str, Any] = {
            "id": prepared.id,
            "object": "chat.completion.chunk",
            "created": prepared.created,
            "model": prepared.model,
            "system_fingerprint": None,
            "choices": []
            if delta is None
            else [
                {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": finish_reason,
                    "logprobs": _choice_logprobs(logprobs),
                }
            ],
        }
        if prepared.include_usage:
            body["usage"] = usage
        if route is not None:  # on the finish chunk: which provider answered
            body["provider"] = route.wire()
        return ChatCompletionChunk.model_validate(body)


def _finish(result: ChatResult, finished: Finished) -> None:
    usage = finished.usage
    result.prompt_tokens = usage.input_tokens
    result.completion_tokens = usage.output_tokens
    result.cached_tokens = usage.cached_tokens
    result.reasoning_tokens = usage.reasoning_tokens
    result.route = finished.route
    if finished.reason == "error" and finished.status is not None:
        # A remote engine's failure: its own refusal (4xx) is the client's to read.
        refused = finished.status < 500
        result.error = (finished.error or FAILED) if refused else FAILED
        result.status = finished.status
    elif finished.reason == "error":
        result.error = FAILED
    elif finished.reason == "interrupted":
        result.error, result.error_code = SHUT_DOWN, "server_shutting_down"
    elif finished.reason == "length":
        result.finish_reason = "length"
    elif result.tool_calls:
        result.finish_reason = "tool_calls"


def _choice_logprobs(logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    return {"content": [logprob_json(lp) for lp in logprobs], "refusal": None}
