"""`POST /v1/responses`: validate, resolve history, translate, fit, generate, drive the event
machine, and persist the result."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

from respd.engines.base import (
    ChatMessage,
    Engine,
    GenerationDone,
    GenerationStream,
    Image,
    SamplingParams,
    TokenChunk,
)
from respd.protocol.errors import InvalidRequest, Unsupported, model_not_found
from respd.protocol.input_tokens import InputTokensRequest
from respd.protocol.responses import CreateResponseRequest, check_include
from respd.service.admission import admit
from respd.service.context import fit_to_context, message_images
from respd.service.events import ResponseEventMachine, Usage
from respd.service.history import History, resolve_history
from respd.service.items import normalize_items
from respd.service.logprobs import LogprobAligner, check_top_logprobs
from respd.service.media import MediaResolver, MediaSettings
from respd.service.output_plan import OutputPlan, plan_output, with_reasoning
from respd.service.reasoning import (
    ReasoningPlan,
    ReasoningReader,
    plan_reasoning,
    template_controls,
)
from respd.service.sampling import SamplingDefaults, build_sampling
from respd.service.structured import check_plan_grammar, responses_answer_schema
from respd.service.tool_parsing import ToolCallParser
from respd.service.tools import responses_tool_choice, responses_tools
from respd.service.translate import Lowering, input_to_messages, require_effective_input
from respd.store.base import JSON, ResponseRecord, Store

log = logging.getLogger(__name__)

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512
LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class PreparedResponse:
    """Everything needed to run a response, computed before the first event."""

    request: CreateResponseRequest
    messages: list[ChatMessage]
    prompt_tokens: list[int]
    sampling: SamplingParams
    echo: dict[str, Any]
    owner: str
    input_items: list[JSON]  # this turn's input, normalised, with ids
    history: History
    plan: OutputPlan | None = None  # tools / structured output: grammar and parser
    reasoning: ReasoningPlan | None = None  # the template's thinking markers, if any

    def reader(self) -> ReasoningReader | ToolCallParser | None:
        """How the output is read: thinking split off ahead of the tool parser (reasoning
        templates), the tool parser alone, or None (plain text)."""
        parser = self.plan.parser() if self.plan else None
        if self.reasoning is None:
            return parser
        return self.reasoning.reader(parser)

    @property
    def images(self) -> list[Image]:
        """The images `prompt_tokens` holds, in order."""
        return message_images(self.messages)

    @property
    def stored(self) -> bool:
        return self.request.store is not False


TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def wire(model: BaseModel) -> JSON:
    """The wire JSON of an SDK object (fields we set; nothing the SDK merely defaults)."""
    return model.model_dump(mode="json", exclude_unset=True, by_alias=True)


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
    if req.prompt is not None:
        raise Unsupported("Stored prompt templates are not supported.", param="prompt")
    check_include(req.include or [])
    check_top_logprobs(req.top_logprobs)


def responses_logprobs(req: CreateResponseRequest) -> int | None:
    """The engine's `logprobs` setting: on (with `top_logprobs` alternatives, default 0)
    only when `include` asks for `message.output_text.logprobs`, as on OpenAI."""
    if LOGPROBS_INCLUDE not in (req.include or []):
        return None
    return req.top_logprobs or 0


def build_echo(
    req: CreateResponseRequest,
    sampling: SamplingParams,
    model_id: str,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    """The request settings a Response object repeats, in OpenAI's field order."""
    text_format = (
        req.text.format.model_dump(by_alias=True, exclude_none=True)
        if (req.text and req.text.format)
        else {"type": "text"}
    )
    return {
        "background": bool(req.background),
        "conversation": {"id": conversation_id} if conversation_id else None,
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


def _check_state_params(req: CreateResponseRequest) -> None:
    if req.background and req.store is False:
        raise InvalidRequest(
            "Background responses must be stored: 'background' requires 'store' to be true.",
            param="background",
            code="invalid_value",
        )


class ResponsesService:
    def __init__(
        self,
        engine: Engine,
        defaults: SamplingDefaults,
        store: Store,
        media: MediaSettings | None = None,
    ) -> None:
        self.engine = engine
        self.defaults = defaults
        self.store = store
        self.media = MediaResolver(store, media)

    def lowering(self, media: dict[str, Any]) -> Lowering:
        return Lowering(self.engine.model_id, self.engine.vision, self.engine.media_marker, media)

    def check_model(self, model: str) -> None:
        if model != self.engine.model_id:
            raise model_not_found(model)

    async def prepare(self, req: CreateResponseRequest, owner: str) -> PreparedResponse:
        """Everything up to the first event; raises (and stores nothing) on a bad request."""
        self.check_model(req.model)
        check_metadata(req.metadata)
        _reject_unimplemented(req)
        _check_state_params(req)
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
        model_id = self.engine.model_id
        history = await resolve_history(
            self.store,
            owner,
            previous_response_id=req.previous_response_id,
            conversation=req.conversation,
        )
        # Media first (fetch, decode, check: async), then the pure translation. History is
        # resolved again from its stored wire shape, so a replay lowers exactly as before.
        past_media = await self.media.resolve_items(history.items, owner)
        input_media = await self.media.resolve_items(req.input, owner)
        past = input_to_messages(
            history.items, model_id=model_id, lowering=self.lowering(past_media)
        )
        messages = past + input_to_messages(
            req.input, model_id=model_id, prior=past, lowering=self.lowering(input_media)
        )
        if req.instructions:
            messages.insert(0, ChatMessage("system", req.instructions))
        require_effective_input(messages)
        effort = req.reasoning.effort if req.reasoning else None
        template_kwargs = template_controls(effort, self.engine.template_source)
        plan = plan_output(
            self.engine.template_source,
            messages,
            tools,
            policy,
            answer_schema=responses_answer_schema(req.text.format if req.text else None),
            answer_param="text.format",
        )
        reasoning = await asyncio.to_thread(
            plan_reasoning, self.engine, plan.messages, plan.template_tools, template_kwargs
        )
        plan = with_reasoning(plan, reasoning, effort)
        await asyncio.to_thread(check_plan_grammar, self.engine, plan, "text.format")
        sampling.grammar = plan.grammar
        sampling.logprobs = responses_logprobs(req)
        messages, tokens = await asyncio.to_thread(
            fit_to_context,
            self.engine,
            plan.messages,
            reserve=req.max_output_tokens or 1,
            truncation=req.truncation or "disabled",
            tools=plan.template_tools,
            template_kwargs=template_kwargs,
        )
        echo = build_echo(req, sampling, model_id, history.conversation_id)
        return PreparedResponse(
            req,
            messages,
            tokens,
            sampling,
            echo,
            owner,
            normalize_items(req.input),
            history,
            plan,
            reasoning,
        )

    def record(self, prepared: PreparedResponse, machine: ResponseEventMachine) -> ResponseRecord:
        return ResponseRecord(
            id=machine.id,
            owner=prepared.owner,
            created_at=machine.created_at,
            status=machine.status,
            background=bool(prepared.request.background),
            response=wire(machine.snapshot()),
            input_items=prepared.input_items,
            previous_response_id=prepared.request.previous_response_id,
            conversation_id=prepared.history.conversation_id,
        )

    async def persist(
        self,
        prepared: PreparedResponse,
        machine: ResponseEventMachine,
        events: list[JSON] | None = None,
    ) -> None:
        """Store a finished response, append its turn to its conversation, in one write.

        `store: false` responses are not kept, but their turn still joins the conversation
        (the conversation is the state the client asked to keep)."""
        conv_id = prepared.history.conversation_id
        conversation = (conv_id, prepared.input_items + machine.output) if conv_id else None
        if prepared.stored:
            await self.store.save_response(
                self.record(prepared, machine), conversation=conversation, events=events
            )
        elif conversation is not None:
            await self.store.add_conversation_items(prepared.owner, *conversation)

    def respond(
        self, prepared: PreparedResponse, machine: ResponseEventMachine | None = None
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        """`run`, persisting the response before its terminal event leaves, so a client
        that saw `response.completed` can retrieve or chain it at once. A client that
        disconnects closes this iterator: the generation stops and nothing is stored.
        Admission happens now, so a full engine is a 503 before any event."""
        machine = machine or ResponseEventMachine(prepared.echo)
        return self._persisting(prepared, machine, self.run(prepared, machine))

    async def _persisting(
        self,
        prepared: PreparedResponse,
        machine: ResponseEventMachine,
        events: AsyncGenerator[ResponseStreamEvent, None],
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        async with aclosing(events):
            async for event in events:
                if event.type in TERMINAL_EVENTS:
                    await self.persist(prepared, machine)
                yield event

    async def count_input_tokens(self, body: InputTokensRequest, owner: str) -> int:
        """The prompt `create` would send the engine for this body, counted exactly (the
        same `prepare`, so it equals the created response's `usage.input_tokens`)."""
        fields = body.model_dump(exclude_none=True, exclude={"personality"})
        fields["model"] = body.model or self.engine.model_id
        req = CreateResponseRequest.model_validate(fields)
        prepared = await self.prepare(req, owner)
        return len(prepared.prompt_tokens)

    def run(
        self, prepared: PreparedResponse, machine: ResponseEventMachine | None = None
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        """Admit the generation now (a full engine is a 503 here, before any event) and
        return the events; closing the iterator cancels the generation."""
        req = prepared.request
        generation = admit(
            self.engine,
            prepared.prompt_tokens,
            prepared.sampling,
            req.prompt_cache_key or req.user,
            prepared.images,
        )
        return self._events(prepared, machine or ResponseEventMachine(prepared.echo), generation)

    async def _events(
        self,
        prepared: PreparedResponse,
        machine: ResponseEventMachine,
        generation: GenerationStream,
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        done: GenerationDone | None = None
        # Thinking split off first (reasoning templates), then the tool parser's reading.
        reader = prepared.reader()
        # Through a reader, logprobs follow the message text they produced (logprobs.py).
        aligner = (
            LogprobAligner()
            if reader is not None and prepared.sampling.logprobs is not None
            else None
        )
        try:
            async with aclosing(generation):
                for event in machine.start():
                    yield event
                async for chunk in generation:
                    if isinstance(chunk, TokenChunk):
                        machine.generated_tokens += len(chunk.token_ids)
                        if reader is None:
                            events = machine.output_text(chunk.text, chunk.logprobs)
                        else:
                            if aligner is not None:
                                aligner.feed(chunk.text, chunk.logprobs)
                            parsed = reader.feed(chunk.text, len(chunk.token_ids))
                            events = machine.apply_parsed(parsed, aligner)
                        for event in events:
                            yield event
                    else:
                        done = chunk
            if reader is not None:
                for event in machine.apply_parsed(reader.finish(), aligner):
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
            reasoning_tokens=reader.reasoning_tokens if isinstance(reader, ReasoningReader) else 0,
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
