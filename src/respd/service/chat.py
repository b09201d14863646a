"""`POST /v1/chat/completions` on the same engine and context rules as Responses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from respd.engines.base import (
    ChatMessage,
    Engine,
    GenerationDone,
    GenerationStream,
    Image,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
    ToolCall,
)
from respd.protocol.chat import ChatCompletionRequest
from respd.protocol.errors import InvalidRequest, MissingParameter, Unsupported, model_not_found
from respd.service.admission import admit
from respd.service.context import fit_to_context, message_images
from respd.service.ids import new_id
from respd.service.logprobs import LogprobAligner, check_top_logprobs, logprob_json
from respd.service.media import MediaResolver
from respd.service.output_plan import OutputPlan, plan_output, with_reasoning
from respd.service.reasoning import (
    ReasoningDelta,
    ReasoningPlan,
    ReasoningReader,
    plan_reasoning,
    template_controls,
)
from respd.service.responses import check_metadata
from respd.service.sampling import SamplingDefaults, build_sampling
from respd.service.stops import StopMatcher
from respd.service.structured import chat_answer_schema, check_plan_grammar
from respd.service.tool_parsing import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    TextDelta,
    ToolCallParser,
)
from respd.service.tools import chat_tool_choice, chat_tools
from respd.service.translate import (
    Lowering,
    lower_message,
    lower_tool_output,
    require_effective_input,
)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 4


@dataclass
class PreparedChat:
    request: ChatCompletionRequest
    prompt_tokens: list[int]
    sampling: SamplingParams
    stops: list[str]
    include_usage: bool
    plan: OutputPlan | None = None
    reasoning: ReasoningPlan | None = None
    images: list[Image] = field(default_factory=list)  # those `prompt_tokens` holds, in order
    id: str = field(default_factory=lambda: "chatcmpl-" + new_id("c")[2:])
    created: int = field(default_factory=lambda: int(time.time()))


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


def _tool_calls(raw: Any, param: str) -> list[ToolCall]:
    if not isinstance(raw, list):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected an array.", param=param, code="invalid_type"
        )
    calls = []
    for j, call in enumerate(raw):
        p = f"{param}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise MissingParameter(f"{p}.function.name")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise MissingParameter(f"{p}.id")
        args = fn.get("arguments")
        calls.append(ToolCall(call_id, fn["name"], args if isinstance(args, str) else "{}"))
    return calls


def _messages(req: ChatCompletionRequest, low: Lowering) -> list[ChatMessage]:
    """`messages` → the conversation, with media lowered as for Responses: images on user
    turns stay in place, those of other turns (tool results included) move to a following
    user turn."""
    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    for i, msg in enumerate(req.messages):
        param = f"messages[{i}]"
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequest(
                f"Invalid value for '{param}.role': expected one of {', '.join(CHAT_ROLES)}, "
                f"got {role!r}.",
                param=f"{param}.role",
                code="invalid_value",
            )
        content = msg.get("content")
        calls = (
            _tool_calls(msg["tool_calls"], f"{param}.tool_calls")
            if (role == "assistant" and msg.get("tool_calls"))
            else []
        )
        if content is None and role != "assistant":
            raise MissingParameter(f"{param}.content")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in names:
                raise InvalidRequest(
                    f"Invalid '{param}.tool_call_id': no earlier assistant message has a tool "
                    f"call with id {call_id!r}.",
                    param=f"{param}.tool_call_id",
                    code="invalid_value",
                )
            text, image_turns = lower_tool_output(content, f"{param}.content", low)
            out.append(ChatMessage("tool", text, tool_call_id=call_id, name=names[call_id]))
            out += image_turns
            continue
        names.update((c.id, c.name) for c in calls)
        reasoning = msg.get("reasoning_content") if role == "assistant" else None
        turns = lower_message(
            "system" if role == "developer" else role,
            "" if content is None else content,
            f"{param}.content",
            low,
        )
        turns[0].tool_calls = calls
        if isinstance(reasoning, str) and reasoning:
            turns[0].reasoning = reasoning
        out += turns
    return out


def _content(
    result: ChatResult, text: str, start: int, aligner: LogprobAligner | None
) -> ContentDelta:
    """`text` joins the message; `start`: its offset in the generated text."""
    result.text += text
    if aligner is None:
        return ContentDelta(text)
    logprobs = aligner.take(start, start + len(text))
    if result.logprobs is not None:
        result.logprobs += logprobs
    return ContentDelta(text, logprobs)


def _read(
    result: ChatResult,
    parser: ToolCallParser | ReasoningReader | None,
    text: str,
    aligner: LogprobAligner | None = None,
    *,
    final: bool = False,
    tokens: int = 0,
) -> list[ContentDelta | ToolCallDelta | ReasoningDelta]:
    """Text after stop sequences → thinking, text and tool-call deltas, recorded in
    `result`. Stop sequences only ever cut the end, so released text is a prefix of the
    generated text, and (without a parser) `result.text` is all of it so far."""
    if parser is None:
        return [_content(result, text, len(result.text), aligner)] if text else []
    out: list[ContentDelta | ToolCallDelta | ReasoningDelta] = []
    events: list[Any] = parser.feed(text, tokens) if text or tokens else []
    if final:
        events += parser.finish()
    for e in events:
        if isinstance(e, ReasoningDelta):
            result.reasoning += e.text
            out.append(e)
        elif isinstance(e, TextDelta):
            out.append(_content(result, e.text, e.start, aligner))
        elif isinstance(e, CallStarted):
            call = ToolCall("call_" + new_id("c")[2:26], e.name, "")
            result.tool_calls.append(call)
            out.append(ToolCallDelta(e.index, id=call.id, name=e.name))
        elif isinstance(e, ArgumentsDelta):
            result.tool_calls[e.index].arguments += e.delta
            out.append(ToolCallDelta(e.index, arguments=e.delta))
        elif isinstance(e, CallFinished):
            result.tool_calls[e.index].arguments = e.arguments
    return out


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
    def __init__(
        self, engine: Engine, defaults: SamplingDefaults, media: MediaResolver | None = None
    ) -> None:
        self.engine = engine
        self.defaults = defaults
        self.media = media

    async def prepare(self, req: ChatCompletionRequest, owner: str = "") -> PreparedChat:
        if req.model != self.engine.model_id:
            raise model_not_found(req.model)
        check_metadata(req.metadata)
        if req.n not in (None, 1):
            raise Unsupported("Only n=1 is supported.", param="n")
        tools = chat_tools(req.tools)
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
        media = await self.media.resolve_messages(req.messages, owner) if self.media else {}
        low = Lowering(self.engine.model_id, self.engine.vision, self.engine.media_marker, media)
        messages = _messages(req, low)
        require_effective_input(messages, param="messages")
        template_kwargs = template_controls(req.reasoning_effort, self.engine.template_source)
        plan = plan_output(
            self.engine.template_source,
            messages,
            tools,
            policy,
            answer_schema=chat_answer_schema(req.response_format),
            answer_param="response_format",
        )
        reasoning = await asyncio.to_thread(
            plan_reasoning, self.engine, plan.messages, plan.template_tools, template_kwargs
        )
        plan = with_reasoning(plan, reasoning, req.reasoning_effort)
        await asyncio.to_thread(check_plan_grammar, self.engine, plan, "response_format")
        sampling.grammar = plan.grammar
        sampling.logprobs = (req.top_logprobs or 0) if req.logprobs else None
        fitted, tokens = await asyncio.to_thread(
            fit_to_context,
            self.engine,
            plan.messages,
            reserve=max_tokens or 1,
            truncation="disabled",
            param="messages",
            tools=plan.template_tools,
            template_kwargs=template_kwargs,
        )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return PreparedChat(
            req, tokens, sampling, stops, include_usage, plan, reasoning, message_images(fitted)
        )

    def generate(
        self, prepared: PreparedChat
    ) -> AsyncGenerator[ContentDelta | ToolCallDelta | ReasoningDelta | ChatResult, None]:
        """Admit the generation now (503 when the engine is full), then yield text and
        tool-call deltas and one final `ChatResult`; closing early cancels the generation."""
        req = prepared.request
        generation = admit(
            self.engine,
            prepared.prompt_tokens,
            prepared.sampling,
            req.prompt_cache_key or req.user,
            prepared.images,
        )
        return self._stream(prepared, generation)

    async def _stream(
        self, prepared: PreparedChat, generation: GenerationStream
    ) -> AsyncGenerator[ContentDelta | ToolCallDelta | ReasoningDelta | ChatResult, None]:
        result = ChatResult(prompt_tokens=len(prepared.prompt_tokens))
        aligner = None
        if prepared.sampling.logprobs is not None:
            aligner, result.logprobs = LogprobAligner(), []
        matcher = StopMatcher(prepared.stops)
        tools = prepared.plan.parser() if prepared.plan else None
        parser: ToolCallParser | ReasoningReader | None = (
            tools if prepared.reasoning is None else prepared.reasoning.reader(tools)
        )  # thinking split off first, on reasoning templates
        done: GenerationDone | None = None
        async with aclosing(generation):
            async for chunk in generation:
                if isinstance(chunk, TokenChunk):
                    n = len(chunk.token_ids)
                    result.completion_tokens += n
                    if aligner is not None:
                        aligner.feed(chunk.text, chunk.logprobs)
                    for item in _read(result, parser, matcher.feed(chunk.text), aligner, tokens=n):
                        yield item
                    if matcher.stopped:
                        break  # closing the stream cancels the rest of the generation
                else:
                    done = chunk
        for item in _read(result, parser, matcher.flush(), aligner, final=True):
            yield item
        if done is not None:
            if done.finish_reason == "error":
                raise RuntimeError(done.error or "generation failed")
            result.cached_tokens = done.cached_tokens
            result.finish_reason = "length" if done.finish_reason == "length" else "stop"
            if result.tool_calls and done.finish_reason != "length":
                result.finish_reason = "tool_calls"
        if isinstance(parser, ReasoningReader):
            result.reasoning_tokens = parser.reasoning_tokens
        yield result

    def usage(self, result: ChatResult) -> dict[str, Any]:
        return {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": result.reasoning_tokens},
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
    ) -> ChatCompletionChunk:
        body: dict[str, Any] = {
            "id": prepared.id,
            "object": "chat.completion.chunk",
            "created": prepared.created,
            "model": self.engine.model_id,
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
        return ChatCompletionChunk.model_validate(body)


def _choice_logprobs(logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    return {"content": [logprob_json(lp) for lp in logprobs], "refusal": None}
