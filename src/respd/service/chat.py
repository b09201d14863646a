"""`POST /v1/chat/completions` on the same engine and context rules as Responses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from respd.engines.base import (
    ChatMessage,
    Engine,
    GenerationDone,
    GenerationStream,
    SamplingParams,
    TokenChunk,
)
from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.errors import InvalidRequest, Unsupported, model_not_found
from respd.service.admission import admit
from respd.service.context import fit_to_context
from respd.service.ids import new_id
from respd.service.responses import check_metadata
from respd.service.sampling import SamplingDefaults, build_sampling
from respd.service.stops import StopMatcher
from respd.service.translate import content_text, require_effective_input

CHAT_ROLES = ("system", "developer", "user", "assistant")
MAX_STOP_SEQUENCES = 4


@dataclass
class PreparedChat:
    request: ChatCompletionRequest
    prompt_tokens: list[int]
    sampling: SamplingParams
    stops: list[str]
    include_usage: bool
    id: str = field(default_factory=lambda: "chatcmpl-" + new_id("c")[2:])
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class ChatResult:
    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def _messages(req: ChatCompletionRequest, model_id: str) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for i, msg in enumerate(req.messages):
        param = f"messages[{i}]"
        role = msg.get("role")
        if role == "tool" or msg.get("tool_calls"):
            raise Unsupported(
                "Tool messages and tool_calls are not supported by this server yet.",
                param=f"{param}.role",
            )
        if role not in CHAT_ROLES:
            raise InvalidRequest(
                f"Invalid value for '{param}.role': expected one of {', '.join(CHAT_ROLES)}, "
                f"got {role!r}.",
                param=f"{param}.role",
                code="invalid_value",
            )
        content = msg.get("content")
        if content is None and role != "assistant":
            raise InvalidRequest(
                f"Missing required parameter: '{param}.content'.",
                param=f"{param}.content",
                code="missing_required_parameter",
            )
        text = (
            "" if content is None else content_text(content, f"{param}.content", model_id=model_id)
        )
        out.append(ChatMessage("system" if role == "developer" else role, text))
    return out


class ChatService:
    def __init__(self, engine: Engine, defaults: SamplingDefaults) -> None:
        self.engine = engine
        self.defaults = defaults

    async def prepare(self, req: ChatCompletionRequest) -> PreparedChat:
        if req.model != self.engine.model_id:
            raise model_not_found(req.model)
        check_metadata(req.metadata)
        if req.n not in (None, 1):
            raise Unsupported("Only n=1 is supported.", param="n")
        if req.tools:
            raise Unsupported("Tools are not supported by this server yet.", param="tools")
        if req.tool_choice not in (None, "auto", "none"):
            raise Unsupported("tool_choice needs tools, not supported yet.", param="tool_choice")
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text":
            raise Unsupported(
                f"response_format of type '{fmt}' is not supported by this server yet.",
                param="response_format",
            )
        if req.logprobs or req.top_logprobs:
            raise Unsupported("Logprobs are not supported by this server yet.", param="logprobs")
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        sampling = build_sampling(
            defaults=self.defaults,
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=max_tokens,
            max_tokens_param="max_completion_tokens"
            if req.max_completion_tokens is not None
            else "max_tokens",
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
        )
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(
                f"Invalid 'stop': at most {MAX_STOP_SEQUENCES} sequences are allowed.",
                param="stop",
                code="invalid_value",
            )
        messages = _messages(req, self.engine.model_id)
        require_effective_input(messages, param="messages")
        _, tokens = await asyncio.to_thread(
            fit_to_context,
            self.engine,
            messages,
            reserve=max_tokens or 1,
            truncation="disabled",
            param="messages",
        )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return PreparedChat(req, tokens, sampling, stops, include_usage)

    def generate(self, prepared: PreparedChat) -> AsyncGenerator[str | ChatResult, None]:
        """Admit the generation now (503 when the engine is full), then yield text deltas
        and one final `ChatResult`; closing early cancels the generation."""
        req = prepared.request
        generation = admit(
            self.engine, prepared.prompt_tokens, prepared.sampling, req.prompt_cache_key or req.user
        )
        return self._stream(prepared, generation)

    async def _stream(
        self, prepared: PreparedChat, generation: GenerationStream
    ) -> AsyncGenerator[str | ChatResult, None]:
        result = ChatResult(prompt_tokens=len(prepared.prompt_tokens))
        matcher = StopMatcher(prepared.stops)
        done: GenerationDone | None = None
        async with aclosing(generation):
            async for chunk in generation:
                if isinstance(chunk, TokenChunk):
                    result.completion_tokens += len(chunk.token_ids)
                    text = matcher.feed(chunk.text)
                    if text:
                        result.text += text
                        yield text
                    if matcher.stopped:
                        break  # closing the stream cancels the rest of the generation
                else:
                    done = chunk
        tail = matcher.flush()
        if tail:
            result.text += tail
            yield tail
        if done is not None:
            if done.finish_reason == "error":
                raise RuntimeError(done.error or "generation failed")
            result.cached_tokens = done.cached_tokens
            result.finish_reason = "length" if done.finish_reason == "length" else "stop"
        yield result

    def usage(self, result: ChatResult) -> dict[str, Any]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0},
        }

    def completion(self, prepared: PreparedChat, result: ChatResult) -> ChatCompletion:
        return ChatCompletion.model_validate(
            {
                "id": prepared.id,
                "object": "chat.completion",
                "created": prepared.created,
                "model": self.engine.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": result.text},
                        "finish_reason": result.finish_reason,
                        "logprobs": None,
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
    ) -> ChatCompletionChunk:
        body: dict[str, Any] = {
            "id": prepared.id,
            "object": "chat.completion.chunk",
            "created": prepared.created,
            "model": self.engine.model_id,
            "system_fingerprint": None,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if prepared.include_usage:
            body["usage"] = usage
        return ChatCompletionChunk.model_validate(body)
