"""One response's course: validate, resolve history, translate, fit, generate, drive the
event machine, and persist the result."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from openai.types.responses import ResponseStreamEvent

from respd.engines.base import ChatMessage, Engine, SamplingParams, ToolDefinition
from respd.protocol.echo import request_echo
from respd.protocol.errors import ContextLengthExceeded, InvalidRequest, Unsupported
from respd.protocol.responses import CreateResponseRequest, check_include
from respd.protocol.wire import wire
from respd.service.generation import core
from respd.service.generation.core import GenerationSpec, Params, PreparedGeneration
from respd.service.generation.logprobs import check_top_logprobs
from respd.service.generation.output import Finished, Started
from respd.service.generation.prompt_cache import prompt_cache
from respd.service.generation.routing import route_of
from respd.service.generation.sampling import build_sampling
from respd.service.generation.structured import responses_answer_schema
from respd.service.media.lowering import Lowering, require_effective_input
from respd.service.metadata import check_metadata
from respd.service.responses.auto_compaction import PendingCompaction, compacting_events
from respd.service.responses.events import ResponseEventMachine
from respd.service.responses.history import History, resolve_history
from respd.service.responses.items import normalize_items
from respd.service.responses.summary import (
    compaction_item,
    compaction_threshold,
    split_for_compaction,
    summarize,
)
from respd.service.responses.tool_loop import MAX_SERVER_CALLS, ToolLoop, tool_loop_events
from respd.service.responses.translate import check_item_shapes, input_to_messages
from respd.service.sealing import Sealer
from respd.service.shared import Shared
from respd.service.tools.definitions import (
    ResponseTools,
    ToolPolicy,
    ToolRoute,
    responses_tool_choice,
)
from respd.service.tools.hosted.plan import HostedTools
from respd.service.tools.tool_search import SearchPlan, load_found, offered_tools
from respd.store.base import JSON, ResponseRecord

log = logging.getLogger(__name__)
ENCRYPTED_REASONING = "reasoning.encrypted_content"
SUMMARY_MODES = frozenset({"auto", "concise", "detailed"})

LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class Turn:
    """A response's place in the stored state: who asked, what it continues and what
    its input adds."""

    request: CreateResponseRequest
    owner: str
    input_items: list[JSON]  # this turn's input, normalised, with ids
    history: History

    @property
    def stored(self) -> bool:
        return self.request.store is not False


@dataclass
class PreparedResponse(Turn):
    """Everything needed to run a response, computed before the first event."""

    # None until a pending compaction (below) has made the prompt
    generation: PreparedGeneration | None = field(kw_only=True)
    echo: dict[str, Any] = field(kw_only=True)
    routes: dict[str, ToolRoute] = field(default_factory=dict, kw_only=True)
    # set when reasoning is to carry `encrypted_content`
    sealer: Sealer | None = field(default=None, kw_only=True)
    # items made before generating (automatic compaction), first in the output
    lead: list[JSON] = field(default_factory=list, kw_only=True)
    # the deferred tools, when this server runs the model's tool searches
    search: SearchPlan | None = field(default=None, kw_only=True)
    # automatic compaction, made in the response's stream before it generates
    compaction: PendingCompaction | None = field(default=None, kw_only=True)
    # the tools this server runs for the model (MCP, file and web search)
    hosted: HostedTools | None = field(default=None, kw_only=True)

    def machine(self, **fields: Any) -> ResponseEventMachine:
        """The event machine for this response: its echo, how its calls map back, whether
        its reasoning is sealed for the client and summarised."""
        sealer = self.sealer
        seal = (lambda text: sealer.seal("reasoning", {"text": text})) if sealer else None
        reasoning = self.request.reasoning
        summary = (reasoning.summary or reasoning.generate_summary) if reasoning else None
        return ResponseEventMachine(
            self.echo,
            routes=self.routes,
            seal_reasoning=seal,
            reasoning_summary=summary if summary in SUMMARY_MODES else None,
            annotate=self.hosted.annotate if self.hosted is not None else None,
            **fields,
        )

    @property
    def prompt_tokens(self) -> int:
        return self.generation.prompt_tokens if self.generation is not None else 0

    @property
    def ready(self) -> PreparedGeneration:
        """The generation, which a prepare that compacts at once always has."""
        assert self.generation is not None, "the compaction is still pending"
        return self.generation


TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


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
    engine: Engine,
    conversation_id: str | None = None,
) -> dict[str, Any]:
    """The request settings a Response object repeats (checked when the request was read,
    see `protocol/echo.py`); sampling the request left to the engine is echoed as the
    engine applies it."""
    defaults = engine.default_sampling
    return {
        **request_echo(req),
        "conversation": {"id": conversation_id} if conversation_id else None,
        "model": engine.model_id,
        "prompt_cache_retention": prompt_cache(None, req.prompt_cache_retention).retention,
        "service_tier": "default",
        "temperature": (
            defaults.get("temperature", 1.0)
            if sampling.temperature is None
            else sampling.temperature
        ),
        "top_p": defaults.get("top_p", 1.0) if sampling.top_p is None else sampling.top_p,
        "frequency_penalty": sampling.frequency_penalty,
        "presence_penalty": sampling.presence_penalty,
    }


def request_sampling(req: CreateResponseRequest) -> SamplingParams:
    return build_sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_output_tokens,
        max_tokens_param="max_output_tokens",
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        dry=req,
    )


def _tool_policy(req: CreateResponseRequest, tools: list[ToolDefinition]) -> ToolPolicy:
    """`tool_choice` over the offered tools, with the request's call settings."""
    policy = responses_tool_choice(req.tool_choice, tools)
    if req.max_tool_calls is not None and req.max_tool_calls < 1:
        raise InvalidRequest(
            "Invalid 'max_tool_calls': expected a value >= 1.",
            param="max_tool_calls",
            code="integer_below_min_value",
        )
    parallel = req.parallel_tool_calls is not False
    return replace(policy, parallel=parallel, max_calls=req.max_tool_calls)


def _check_state_params(req: CreateResponseRequest) -> None:
    if req.background and req.store is False:
        raise InvalidRequest(
            "Background responses must be stored: 'background' requires 'store' to be true.",
            param="background",
            code="invalid_value",
        )


class ResponseRunner:
    """A response as an adapter over the generation core: the request and its history
    become a `GenerationSpec`; the core's events drive the `ResponseEventMachine`."""

    def __init__(self, shared: Shared) -> None:
        self.models = shared.models
        self.sealer = shared.sealer
        self.store = shared.store
        self.media = shared.media
        self.runs = shared.runs
        self.limits = shared.limits
        self.toolbox = shared.toolbox

    async def checked_engine(self, req: CreateResponseRequest) -> Engine:
        """The engine of the request's model (loaded, for a local model not loaded yet),
        after the checks that need no history (sizes, item shapes, metadata, fields not
        built, state settings)."""
        self.limits.check(req.input, req.instructions, req.tools, items_param="input")
        self.limits.check_max_tokens(req.max_output_tokens, "max_output_tokens")
        self.models.resolve(req.model)  # an unknown model is a 404 before anything else
        check_item_shapes(req.input)
        check_metadata(req.metadata)
        _reject_unimplemented(req)
        _check_state_params(req)
        return await self.models.ready(req.model)

    async def context(
        self,
        engine: Engine,
        req: CreateResponseRequest,
        owner: str,
        items: str | list[JSON] | None,
    ) -> tuple[History, list[ChatMessage]]:
        """The history the request continues, and the prompt's turns: that history, then
        `items` (the request's input, or what of it the model reads)."""
        history = await resolve_history(
            self.store,
            owner,
            previous_response_id=req.previous_response_id,
            conversation=req.conversation,
        )
        return history, await self.conversation(engine, owner, history, items, req.instructions)

    async def prepare(
        self,
        req: CreateResponseRequest,
        owner: str,
        *,
        stream_compaction: bool = False,
        counting: bool = False,
    ) -> PreparedResponse:
        """Everything up to the first event; raises (and stores nothing) on a bad request.
        With `stream_compaction`, an automatic compaction is left for `run` to make in the
        response's stream; otherwise it is made now. `counting`: only the prompt is wanted
        (no approved tool call runs)."""
        engine = await self.checked_engine(req)
        cache = prompt_cache(req.prompt_cache_key, req.prompt_cache_retention)
        sampling = request_sampling(req)
        sampling.logprobs = responses_logprobs(req)
        offered = offered_tools(req.tools, engine.check_schema)
        if offered.omitted:
            log.warning(
                "hosted tools left out of the prompt (not run by this server): %s",
                ", ".join(offered.omitted),
            )
        history, messages = await self.context(engine, req, owner, req.input)
        # tools earlier searches loaded: offered, and choosable, like the request's own
        load_found(offered, [history.items, req.input], engine.check_schema)
        input_items = normalize_items(req.input)
        hosted = await self._hosted(
            engine, req, owner, offered, history, input_items, messages, counting
        )
        tools = offered.tools
        policy = _tool_policy(req, tools)
        answer = responses_answer_schema(req.text.format if req.text else None, engine.check_schema)
        spec = GenerationSpec(
            messages=messages,
            sampling=sampling,
            tools=tools,
            policy=policy,
            answer_schema=answer,
            reasoning_effort=req.reasoning.effort if req.reasoning else None,
            truncate=req.truncation == "auto",
            # Without a key of the client's, a conversation's turns share one: the KV
            # cache's slots and saved states rank its own history first among equals,
            # in this process and, from the disk tier, after a restart.
            cache_key=cache.key or req.user or history.root_id,
            retain=cache.retain,
            params=Params(),
            route=route_of(req.provider),
        )
        fitted = await self._fit(engine, spec, req.context_management)
        generation: PreparedGeneration | None = None
        pending: PendingCompaction | None = None
        lead: list[JSON] = [*hosted.listed, *hosted.ran] if hosted is not None else []
        if not isinstance(fitted, PendingCompaction):
            generation = fitted
        elif stream_compaction:
            pending = fitted
        else:
            summary = await summarize(engine, fitted.replaced, self.runs)
            generation = await core.prepare(engine, fitted.compacted(summary.text))
            lead = [compaction_item(self.sealer, summary.text), *lead]
        echo = build_echo(req, sampling, engine, history.conversation_id)
        return PreparedResponse(
            req,
            owner,
            input_items,
            history,
            generation=generation,
            echo=echo,
            routes=offered.routes,
            sealer=self.sealer if ENCRYPTED_REASONING in (req.include or []) else None,
            lead=lead,
            search=offered.search if offered.search.hosted else None,
            compaction=pending,
            hosted=hosted,
        )

    async def _hosted(
        self,
        engine: Engine,
        req: CreateResponseRequest,
        owner: str,
        offered: ResponseTools,
        history: History,
        input_items: list[JSON],
        messages: list[ChatMessage],
        counting: bool = False,
    ) -> HostedTools | None:
        """The server-run tools, offered beside the request's own (their calls routed to
        their items), and the calls approved in this turn added to `messages`; None when
        the request has none and answers no approval."""
        answers = any(i.get("type") == "mcp_approval_response" for i in input_items)
        if not offered.hosted and not answers:
            return None
        question = next((m.text for m in reversed(messages) if m.role == "user"), None)
        hosted = await self.toolbox.plan(
            offered.hosted,
            owner=owner,
            include=req.include or [],
            history=history.items,
            input_items=input_items,
            check=engine.check_schema,
            run_approved=not counting,
            question=question,
        )
        if hosted is None:
            return None
        names = {t.name for t in offered.tools}
        for tool in hosted.definitions:
            if tool.name in names:
                raise InvalidRequest(
                    f"Duplicate function name '{tool.name}' in 'tools': a server-run tool is "
                    "shown to the model under that name.",
                    param="tools",
                    code="invalid_value",
                )
            offered.tools.append(tool)
            offered.routes[tool.name] = hosted.routes[tool.name]
        lowering = Lowering(engine.model_id, engine.vision)
        messages += input_to_messages(hosted.prompt_items, prior=messages, lowering=lowering)
        return hosted

    async def _fit(
        self, engine: Engine, spec: GenerationSpec, management: list[JSON] | None
    ) -> PreparedGeneration | PendingCompaction:
        """The generation; with `context_management` compaction, a prompt over its
        threshold (or over the context) instead gets the turns before its last user turn
        replaced by the model's summary (see `auto_compaction.py`)."""
        threshold = compaction_threshold(management, engine.context_window)
        generation: PreparedGeneration | None = None
        try:
            generation = await core.prepare(engine, spec)
        except ContextLengthExceeded:
            if threshold is None:
                raise
        if generation is not None and (threshold is None or generation.prompt_tokens <= threshold):
            return generation
        parts = split_for_compaction(spec.messages)
        if parts is None:  # nothing to replace: as it is (or its error)
            return generation or await core.prepare(engine, spec)
        return PendingCompaction(engine, spec, *parts)

    async def conversation(
        self,
        engine: Engine,
        owner: str,
        history: History,
        items: str | list[JSON] | None,
        instructions: str | None,
    ) -> list[ChatMessage]:
        """The prompt's turns: the history, then this request's items, after the
        instructions; a conversation with nothing to answer is a 400."""
        # Media first (fetch, decode, check: async), then the pure translation. History is
        # resolved again from its stored wire shape, so a replay lowers exactly as before.
        past_media = await self.media.resolve_items(history.items, owner)
        input_media = await self.media.resolve_items(items, owner)
        past = input_to_messages(
            history.items,
            lowering=Lowering.for_engine(engine, past_media, self.media.settings),
            sealer=self.sealer,
        )
        messages = past + input_to_messages(
            items,
            prior=past,
            lowering=Lowering.for_engine(engine, input_media, self.media.settings),
            sealer=self.sealer,
        )
        if instructions:
            messages.insert(0, ChatMessage("system", instructions))
        require_effective_input(messages)
        return messages

    def record(self, prepared: Turn, machine: ResponseEventMachine) -> ResponseRecord:
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
        prepared: Turn,
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
        machine = machine or prepared.machine()
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

    def run(
        self, prepared: PreparedResponse, machine: ResponseEventMachine | None = None
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        """Admit the generation now (a full engine is a 503 here, before any event) and
        return the events; closing the iterator cancels the generation. A pending
        compaction is made first, in the stream; its answer is admitted after it."""
        machine = machine or prepared.machine()
        pending = prepared.compaction
        if pending is None:
            return self._admitted(prepared, machine)

        async def then(spec: GenerationSpec) -> AsyncGenerator[ResponseStreamEvent, None]:
            prepared.generation = await core.prepare(pending.engine, spec)
            prepared.compaction = None
            return self._admitted(prepared, machine, started=True)

        return compacting_events(machine, pending, self.runs, self.sealer, then)

    def _admitted(
        self, prepared: PreparedResponse, machine: ResponseEventMachine, *, started: bool = False
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        ready = prepared.ready
        generation = core.run(ready, self.runs)
        if prepared.search is not None or prepared.hosted is not None:
            cap = prepared.request.max_tool_calls  # counts every server-run call
            loop = ToolLoop(
                ready.engine,
                ready.spec,
                self.runs,
                prepared.search,
                prepared.hosted,
                max_calls=cap or MAX_SERVER_CALLS,
            )
            loop.max_searches = min(loop.max_searches, loop.max_calls)
            return tool_loop_events(machine, generation, prepared.lead, loop, started=started)
        return self._events(machine, generation, prepared.lead, started=started)

    async def _events(
        self,
        machine: ResponseEventMachine,
        generation: core.Run,
        lead: list[JSON],
        *,
        started: bool = False,
    ) -> AsyncGenerator[ResponseStreamEvent, None]:
        async with aclosing(generation):
            for event in [] if started else machine.start():
                yield event
            for made in lead:
                for event in machine.whole_item(made):
                    yield event
            stopped = False  # steered: output past the boundary is not shown
            async for item in generation:
                machine.generated_tokens = generation.produced
                for event in machine.notices():  # steering, ahead of what follows it
                    yield event
                if isinstance(item, Finished):
                    events = machine.end(item)
                elif isinstance(item, Started):
                    events = machine.begin()
                elif stopped:
                    continue
                elif machine.steered and (closing := machine.stop_for_steer(item)) is not None:
                    events, stopped = closing, True
                    generation.interrupt("steered")
                else:
                    events = machine.apply(item)
                for event in events:
                    yield event
