"""`POST /v1/responses`: validate, translate, fit, generate, and drive the event machine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import ChatMessage, Engine, GenerationDone, SamplingParams, TokenChunk
from respd.protocol.errors import InvalidRequest, Unsupported, model_not_found
from respd.protocol.responses import INCLUDABLE, CreateResponseRequest
from respd.service.context import fit_to_context
from respd.service.events import ResponseEventMachine, Usage
from respd.service.output_plan import OutputPlan, plan_output
from respd.service.sampling import SamplingDefaults, build_sampling
from respd.service.structured import check_plan_grammar, responses_answer_schema
from respd.service.tool_parsing import ToolCallParser
from respd.service.tools import responses_tool_choice, responses_tools
from respd.service.translate import input_to_messages, require_effective_input

log = logging.getLogger(__name__)

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512


@dataclass
class PreparedResponse:
    """Everything needed to run a response, computed before the first event."""

    request: CreateResponseRequest
    messages: list[ChatMessage]
    prompt_tokens: list[int]
    sampling: SamplingParams
    echo: dict[str, Any]
    plan: OutputPlan | None = None


def check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidRequest(
            f"Invalid 'metadata': too many properties. Expected at most {METADATA_MAX_PAIRS}, "
            f"but got {len(metadata)}.",
            param="metadata",
            code="object_above_max_properties",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise InvalidRequest(
                f"Invalid 'metadata': key {key[:20]!r}... is longer than {METADATA_MAX_KEY} "
                "characters.",
                param="metadata",
                code="invalid_value",
            )
        if len(value) > METADATA_MAX_VALUE:
            raise InvalidRequest(
                f"Invalid 'metadata': the value of {key!r} is longer than {METADATA_MAX_VALUE} "
                "characters.",
                param="metadata",
                code="invalid_value",
            )


def _reject_unimplemented(req: CreateResponseRequest) -> None:
    """Fields whose behaviour is not built yet: a 400 that names them, never silence."""
    if req.previous_response_id is not None:
        raise Unsupported(
            "previous_response_id is not supported by this server yet.",
            param="previous_response_id",
        )
    if req.conversation is not None:
        raise Unsupported("conversation is not supported by this server yet.", param="conversation")
    if req.background:
        raise Unsupported(
            "background responses are not supported by this server yet.", param="background"
        )
    if req.prompt is not None:
        raise Unsupported("Stored prompt templates are not supported.", param="prompt")
    for value in req.include or []:
        if value not in INCLUDABLE:
            raise InvalidRequest(
                f"Invalid value for 'include': {value!r}. Supported values are: "
                f"{', '.join(sorted(INCLUDABLE))}.",
                param="include",
                code="invalid_value",
            )
    if "message.output_text.logprobs" in (req.include or []) or (req.top_logprobs or 0) > 0:
        raise Unsupported("Logprobs are not supported by this server yet.", param="top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise InvalidRequest(
            "Invalid 'top_logprobs': expected a value between 0 and 20.",
            param="top_logprobs",
            code="invalid_value",
        )


def build_echo(
    req: CreateResponseRequest, sampling: SamplingParams, model_id: str
) -> dict[str, Any]:
    """The request settings a Response object repeats, in OpenAI's field order."""
    text_format = (
        req.text.format.model_dump(by_alias=True, exclude_none=True)
        if (req.text and req.text.format)
        else {"type": "text"}
    )
    return {
        "background": bool(req.background),
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": model_id,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": req.prompt_cache_key,
        "prompt_cache_retention": req.prompt_cache_retention,
        "reasoning": {
            "effort": req.reasoning.effort if req.reasoning else None,
            "summary": req.reasoning.summary if req.reasoning else None,
        },
        "safety_identifier": req.safety_identifier,
        "service_tier": "default",
        "store": True if req.store is None else req.store,
        "temperature": sampling.temperature,
        "text": {
            "format": text_format,
            "verbosity": (req.text.verbosity if req.text else None) or "medium",
        },
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_logprobs": req.top_logprobs or 0,
        "top_p": sampling.top_p,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "metadata": req.metadata or {},
        "frequency_penalty": sampling.frequency_penalty,
        "presence_penalty": sampling.presence_penalty,
    }


class ResponsesService:
    def __init__(self, engine: Engine, defaults: SamplingDefaults) -> None:
        self.engine = engine
        self.defaults = defaults

    def check_model(self, model: str) -> None:
        if model != self.engine.model_id:
            raise model_not_found(model)

    async def prepare(self, req: CreateResponseRequest) -> PreparedResponse:
        self.check_model(req.model)
        check_metadata(req.metadata)
        _reject_unimplemented(req)
        sampling = build_sampling(
            defaults=self.defaults,
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_output_tokens,
            max_tokens_param="max_output_tokens",
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
        )
        tools = responses_tools(req.tools)
        policy = responses_tool_choice(req.tool_choice, tools)
        if req.max_tool_calls is not None and req.max_tool_calls < 1:
            raise InvalidRequest(
                "Invalid 'max_tool_calls': expected a value >= 1.",
                param="max_tool_calls",
                code="integer_below_min_value",
            )
        policy = replace(
            policy, parallel=req.parallel_tool_calls is not False, max_calls=req.max_tool_calls
        )
        messages = input_to_messages(req.input, model_id=self.engine.model_id)
        if req.instructions:
            messages.insert(0, ChatMessage("system", req.instructions))
        require_effective_input(messages)
        plan = plan_output(
            self.engine.template_source,
            messages,
            tools,
            policy,
            answer_schema=responses_answer_schema(req.text.format if req.text else None),
            answer_param="text.format",
        )
        await asyncio.to_thread(check_plan_grammar, self.engine, plan, "text.format")
        sampling.grammar = plan.grammar
        messages, tokens = await asyncio.to_thread(
            fit_to_context,
            self.engine,
            plan.messages,
            reserve=req.max_output_tokens or 1,
            truncation=req.truncation or "disabled",
            tools=plan.template_tools,
        )
        return PreparedResponse(
            req, messages, tokens, sampling, build_echo(req, sampling, self.engine.model_id), plan
        )

    async def run(
        self, prepared: PreparedResponse, machine: ResponseEventMachine | None = None
    ) -> AsyncIterator[ResponseStreamEvent]:
        """Generate and yield every event; closing this iterator cancels the generation."""
        machine = machine or ResponseEventMachine(prepared.echo)
        for event in machine.start():
            yield event
        done: GenerationDone | None = None
        parser: ToolCallParser | None = prepared.plan.parser() if prepared.plan else None
        generation = self.engine.generate(prepared.prompt_tokens, prepared.sampling)
        try:
            async with aclosing(generation):
                async for chunk in generation:
                    if isinstance(chunk, TokenChunk):
                        if parser is None:
                            events = machine.output_text(chunk.text)
                        else:
                            events = machine.apply_parsed(parser.feed(chunk.text))
                        for event in events:
                            yield event
                    else:
                        done = chunk
            if parser is not None:
                for event in machine.apply_parsed(parser.finish()):
                    yield event
        except Exception as exc:  # the engine broke: the client gets response.failed
            log.exception("response %s: generation raised", machine.id)
            done = GenerationDone("error", len(prepared.prompt_tokens), 0, error=str(exc))
        if done is None:
            done = GenerationDone("error", len(prepared.prompt_tokens), 0, error="no result")
        usage = Usage(
            input_tokens=done.prompt_tokens,
            output_tokens=done.completion_tokens,
            cached_tokens=done.cached_tokens,
        )
        if done.finish_reason == "error":
            log.error("response %s failed: %s", machine.id, done.error)
            events = machine.fail("The model failed while generating this response.")
        elif done.finish_reason == "cancelled":
            events = machine.cancel(usage=usage)
        elif done.finish_reason == "length":
            events = machine.finish(usage=usage, incomplete_reason="max_output_tokens")
        else:
            events = machine.finish(usage=usage)
        for event in events:
            yield event
