"""The generation core both APIs share: a request-neutral spec → a prepared prompt → events.

`prepare` plans the output (which tools the model sees, the constraint, how many calls are
read), has the engine build the prompt (rendered once, fitted, constraint compiled) and maps
the engine's refusals to OpenAI's 400s. `run` admits the generation at once (a full engine
is a 503 before any event) and yields `output.py`'s events, ending with exactly one
`Finished` — also when the engine fails mid-stream, so no adapter ever sees a traceback.
Closing the iterator cancels the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from respd.engines.base import (
    Admitted,
    ChatMessage,
    Engine,
    EngineBusy,
    GenerationDone,
    GenerationStream,
    Prompt,
    PromptError,
    PromptRequest,
    PromptTooLong,
    SamplingParams,
    ToolDefinition,
)
from respd.engines.constraints import ConstraintError
from respd.engines.route import NoRoute, Route
from respd.logs import prompts_logged
from respd.protocol.errors import APIError, ContextLengthExceeded, InvalidRequest
from respd.service.generation.admission import AdmissionGate
from respd.service.generation.output import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    Finished,
    FinishKind,
    OutputEvent,
    Started,
    StreamEvent,
    Usage,
)
from respd.service.generation.plan import plan_output
from respd.service.generation.policy import OutputPolicy
from respd.service.generation.reader import OutputReader
from respd.service.generation.routing import no_route_error
from respd.service.tools.definitions import ToolPolicy

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
# How long a turn that ended early (a stop sequence, a loop) waits for its cancelled
# generation's end: one engine step, or an upstream connection closing.
CANCEL_GRACE = 1.0

Api = Literal["responses", "chat"]


@dataclass(frozen=True)
class Params:
    """The names a client's API gives the spec's fields, for error messages."""

    messages: str = "input"
    answer: str = "text.format"
    tool_choice: str = "tool_choice"
    max_tokens: str = "max_output_tokens"

    @property
    def api(self) -> Api:
        """Which API asked: Chat Completions names the conversation `messages`."""
        return "chat" if self.messages == "messages" else "responses"


class GenerationObserver(Protocol):
    """Told about every run (for metrics), so the service needs no metrics library.
    Seconds count from admission, queueing included: what a client waits."""

    def first_token(self, api: Api, seconds: float) -> None: ...

    def finished(self, api: Api, usage: Usage, seconds: float) -> None: ...


@dataclass
class GenerationSpec:
    """One generation, in neither API's terms."""

    messages: list[ChatMessage]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: list[ToolDefinition] = field(default_factory=list)
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    answer_schema: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    truncate: bool = False
    cache_key: str | None = None
    # Keep the prompt's KV in the engine's longest-lived cache (`prompt_cache_retention`
    # "24h").
    retain: bool = False
    params: Params = field(default_factory=Params)
    # The request's provider preferences, for a model routed across providers.
    route: Route | None = None


@dataclass
class PreparedGeneration:
    engine: Engine
    spec: GenerationSpec
    prompt: Prompt
    tool_names: frozenset[str]
    max_calls: int | None

    @property
    def prompt_tokens(self) -> int:
        return self.prompt.n_tokens


async def prepare(engine: Engine, spec: GenerationSpec) -> PreparedGeneration:
    """Everything before the first event; raises an `APIError` for a request that cannot
    run (and nothing has started)."""
    p = spec.params
    plan = plan_output(
        spec.tools,
        spec.policy,
        spec.answer_schema,
        answer_param=p.answer,
        choice_param=p.tool_choice,
    )
    reserve = spec.sampling.max_tokens or 1
    window = engine.context_window
    if reserve >= window:
        raise ContextLengthExceeded(
            f"{p.max_tokens} ({reserve}) must be smaller than the model's context window of "
            f"{window} tokens.",
            param=p.max_tokens,
        )
    request = PromptRequest(
        messages=spec.messages,
        tools=plan.tools,
        constraint=plan.constraint,
        reasoning_effort=spec.reasoning_effort,
        reserve=reserve,
        truncate=spec.truncate,
        route=spec.route,
    )
    try:
        prompt = await engine.prepare(request)
    except NoRoute as exc:
        raise no_route_error(exc) from exc
    except EngineBusy as exc:  # a model unloaded while its prompt was being prepared
        raise _overloaded(exc) from exc
    except PromptTooLong as exc:
        if exc.truncated:
            message = (
                f"This model's maximum context length is {exc.window} tokens; even after "
                f"truncating older turns the input needs {exc.n_tokens} tokens plus "
                f"{exc.reserve} for output."
            )
        else:
            message = (
                f"This model's maximum context length is {exc.window} tokens. However, your "
                f"request needs {exc.n_tokens} input tokens plus {exc.reserve} for output. "
                f"Shorten the input, lower {p.max_tokens}"
                + (", or set truncation to 'auto'." if p.messages == "input" else ".")
            )
        raise ContextLengthExceeded(message, param=p.messages) from exc
    except PromptError as exc:
        raise InvalidRequest(f"The input cannot be processed: {exc}.", param=p.messages) from exc
    except ConstraintError as exc:
        if exc.target == "calls":
            raise InvalidRequest(
                f"A tool's parameters cannot be enforced: {exc}.",
                param="tools",
                code="invalid_function_parameters",
            ) from exc
        raise InvalidRequest(
            f"Invalid schema in '{p.answer}': {exc}.", param=p.answer, code="invalid_value"
        ) from exc
    names = frozenset(t.name for t in plan.tools)
    return PreparedGeneration(engine, spec, prompt, names, plan.max_calls)


def _overloaded(exc: EngineBusy) -> APIError:
    return APIError(
        f"The server is overloaded: {exc}. Please retry shortly.",
        status_code=503,
        error_type="server_error",
        code="server_is_overloaded",
        headers={"retry-after": str(RETRY_AFTER_SECONDS)},
    )


class Run:
    """One admitted generation: iterate it for its events; `produced` counts the tokens
    generated so far; closing it cancels the generation; `interrupt` ends it early but
    still with its `Finished` (`interrupted` for a server that shuts down, `steered` for
    a response that new input takes over)."""

    def __init__(
        self, prepared: PreparedGeneration, stream: GenerationStream, runs: ActiveRuns | None
    ) -> None:
        self.produced = 0
        self.interrupted = False
        self.interrupted_as: FinishKind = "interrupted"
        self.started_at = time.monotonic()
        self.observer = runs.observer if runs is not None else None
        self.policy = runs.output if runs is not None else OutputPolicy()
        self._stream = stream
        self._runs = runs
        if runs is not None:
            runs.add(self)
        self._events = _events(prepared, stream, self)

    def __aiter__(self) -> AsyncGenerator[StreamEvent, None]:
        return self._events

    async def aclose(self) -> None:
        await self._events.aclose()

    def interrupt(self, reason: FinishKind = "interrupted") -> None:
        self.interrupted = True
        self.interrupted_as = reason
        self._stream.cancel()

    def ended(self) -> None:
        if self._runs is not None:
            self._runs.discard(self)

    def looped(self, api: Api) -> None:
        """The output fell into a loop, and the turn was cut there."""
        log.warning(
            "generation stopped: repetition (%d tokens, a span repeated %d times)",
            self.produced,
            self.policy.repetition_stop,
        )
        if self._runs is not None:
            self._runs.looped[api] += 1

    def check_window(
        self, api: Api, done: GenerationDone, produced: int, window: int | None
    ) -> None:
        """Log and count a turn that filled the context window (nothing else ended it)."""
        tokens = done.prompt_tokens + (done.completion_tokens or produced)
        if done.finish_reason != "length" or not window or tokens < window:
            return
        log.warning("generation stopped: context end (%d tokens in the window)", tokens)
        if self._runs is not None:
            self._runs.context_ends[api] += 1


class ActiveRuns:
    """The generations running in this server, so a shutdown can let them finish within a
    grace period, then interrupt the rest (each still ends with its terminal event).
    `observer`, when set, hears about each run; `output` bounds each run's output."""

    def __init__(
        self,
        observer: GenerationObserver | None = None,
        gate: AdmissionGate | None = None,
        output: OutputPolicy | None = None,
    ) -> None:
        self._runs: set[Run] = set()
        # tool calls the server runs between passes of a response: busy like a run
        self._calls: set[asyncio.Future[Any]] = set()
        self.gate = gate  # shares the engines' slots fairly between identities
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False
        self.observer = observer
        self.output = output or OutputPolicy()
        self.looped: dict[Api, int] = {"responses": 0, "chat": 0}  # turns the loop stop ended
        self.context_ends: dict[Api, int] = {"responses": 0, "chat": 0}  # turns the window ended

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, run: Run) -> None:
        self._runs.add(run)
        self._idle.clear()

    def discard(self, run: Run) -> None:
        self._runs.discard(run)
        if not self._runs and not self._calls:
            self._idle.set()

    def track(self, call: asyncio.Future[Any]) -> None:
        """A server-run tool call: a shutdown waits for it as for a run, then cancels it."""
        self._calls.add(call)
        self._idle.clear()
        call.add_done_callback(self._untrack)

    def _untrack(self, call: asyncio.Future[Any]) -> None:
        self._calls.discard(call)
        if not self._runs and not self._calls:
            self._idle.set()

    async def drain(self, grace: float, *, settle: float = 10.0) -> int:
        """Refuse new generations; wait up to `grace` seconds for the running ones, then
        interrupt those left and give them `settle` seconds to send their last events.
        Returns how many were interrupted."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), grace)
        left = list(self._runs)
        for run in left:
            run.interrupt()
        calls = list(self._calls)
        for call in calls:
            call.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), settle)
        return len(left) + len(calls)


def run(prepared: PreparedGeneration, runs: ActiveRuns | None = None) -> Run:
    """Admit the generation now (503 when the engine is full, or the server is shutting
    down) and return its events."""
    spec = prepared.spec
    if runs is not None and runs.draining:
        raise APIError(
            "The server is shutting down; retry on another replica or shortly.",
            status_code=503,
            error_type="server_error",
            code="server_shutting_down",
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        )
    engine = prepared.engine
    policy = runs.output if runs is not None else OutputPolicy()
    sampling = spec.sampling
    if sampling.max_tokens is None and (cap := policy.cap(engine.context_window)):
        # Only a bound, not reserved room: a long prompt still gets what is left.
        room = (engine.context_window or cap + prepared.prompt_tokens) - prepared.prompt_tokens
        sampling = replace(sampling, max_tokens=max(1, min(cap, room)))

    def start() -> GenerationStream:
        return engine.generate(
            prepared.prompt, sampling, cache_key=spec.cache_key, retain=spec.retain
        )

    gate = runs.gate if runs is not None else None
    try:
        if gate is None:
            stream = start()
        else:
            stream = gate.open(engine.model_id, start, prepared.prompt_tokens)
    except EngineBusy as exc:
        raise _overloaded(exc) from exc
    if prompts_logged():
        turns = [{"role": m.role, "content": m.text} for m in prepared.prompt.messages]
        log.info("prompt (%d tokens): %s", prepared.prompt_tokens, json.dumps(turns))
    return Run(prepared, stream, runs)


async def _events(
    prepared: PreparedGeneration, stream: GenerationStream, progress: Run
) -> AsyncGenerator[StreamEvent, None]:
    try:
        spec = prepared.spec
        engine = prepared.engine
        reader = _reader(prepared, progress.policy)
        guard = RepeatGuard()
        done: GenerationDone | None = None
        produced = 0
        ended = False  # a stop sequence or a repeated call ended the turn early
        closing = False  # the output looped, and the engine is closing its value
        started = False
        first = False  # the first output (past admission) arrived
        try:
            async with aclosing(stream):
                async for chunk in stream:
                    if isinstance(chunk, GenerationDone):
                        done = chunk
                        continue
                    if not started:
                        started = True
                        yield Started()
                    if isinstance(chunk, Admitted):
                        continue
                    if not first and progress.observer is not None:
                        seconds = time.monotonic() - progress.started_at
                        progress.observer.first_token(spec.params.api, seconds)
                    first = True
                    produced += chunk.n_tokens
                    progress.produced = produced
                    for event in guard.filter(reader.feed(chunk)):
                        yield event
                    if reader.looped and not closing:  # closed, a looped answer still parses
                        closing = stream.wrap_up()
                    if reader.stopped or guard.ended or (reader.looped and not closing):
                        ended = True
                        done = await _cancelled_end(stream)
                        break
            cut_off = reader.looped or (done is not None and done.finish_reason == "length")
            for event in guard.filter(reader.finish(cut_off=cut_off)):
                yield event
        except Exception as exc:  # the engine broke: the adapters end honestly
            log.exception("generation raised")
            done = GenerationDone("error", prepared.prompt_tokens, produced, error=str(exc))
        closed = closing and not progress.interrupted
        done = _reconciled(
            prepared, done, produced, ended=ended, looped=reader.looped, closed=closed
        )
        if reader.looped:
            progress.looped(spec.params.api)
        progress.check_window(spec.params.api, done, produced, engine.context_window)
        usage = Usage(
            input_tokens=done.prompt_tokens,
            output_tokens=done.completion_tokens or produced,
            cached_tokens=done.cached_tokens,
            reasoning_tokens=(
                reader.reasoning_tokens if done.reasoning_tokens is None else done.reasoning_tokens
            ),
        )
        if done.finish_reason == "error":
            log.error("generation failed: %s", done.error)
        reason: FinishKind = done.finish_reason
        if reason == "cancelled" and progress.interrupted:
            reason = progress.interrupted_as
        if progress.observer is not None:
            seconds = time.monotonic() - progress.started_at
            progress.observer.finished(spec.params.api, usage, seconds)
        yield Finished(
            reason,
            usage,
            calls=guard.calls,
            error=done.error,
            status=done.status,
            cause="repetition" if reader.looped else None,
            route=done.route,
        )
    finally:
        progress.ended()


def _reader(prepared: PreparedGeneration, policy: OutputPolicy) -> OutputReader:
    spec = prepared.spec
    return OutputReader(
        prepared.engine.profile,
        reasoning_open=prepared.prompt.reasoning_open,
        tool_names=prepared.tool_names,
        max_calls=prepared.max_calls,
        stops=spec.sampling.stop,
        logprobs=spec.sampling.logprobs is not None,
        repetition_stop=policy.repetition_stop,
    )


async def _cancelled_end(stream: GenerationStream) -> GenerationDone | None:
    """The end a stream still reports once cancelled (its cached tokens, the provider that
    answered); None when it does not come within `CANCEL_GRACE` seconds. The tokens past
    the cancel are dropped: the turn already ended."""
    stream.cancel()
    try:
        async with asyncio.timeout(CANCEL_GRACE):
            async for chunk in stream:
                if isinstance(chunk, GenerationDone):
                    return chunk
    except TimeoutError:
        log.warning("a cancelled generation did not end within %gs", CANCEL_GRACE)
    return None


def _reconciled(
    prepared: PreparedGeneration,
    done: GenerationDone | None,
    produced: int,
    *,
    ended: bool,
    looped: bool,
    closed: bool,
) -> GenerationDone:
    """How the generation ended. A stop sequence, a repeated call or a loop that ended the
    turn is its end, whatever the engine reported for the tokens past it (which provider
    answered still holds); a looped answer the engine closed ends `length`."""
    if done is None or ended:
        early = _ended_early(prepared, produced, ended, looped)
        if done is None:
            return early
        return replace(early, cached_tokens=done.cached_tokens, route=done.route)
    if closed and done.finish_reason in ("stop", "cancelled"):
        return replace(done, finish_reason="length")  # the loop cut it, closed or not
    return done


def _ended_early(
    prepared: PreparedGeneration, produced: int, ended: bool, looped: bool
) -> GenerationDone:
    """How a generation ended that the engine did not report an end for: a stop sequence
    or a repeated call ends a turn (`stop`), a loop cuts it (`length`), else it failed."""
    if looped:
        return GenerationDone("length", prepared.prompt_tokens, produced)
    if ended:
        return GenerationDone("stop", prepared.prompt_tokens, produced)
    error = "the generation ended without a result"
    return GenerationDone("error", prepared.prompt_tokens, produced, error=error)


def _same_arguments(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


class RepeatGuard:
    """Ends the turn at a call identical to an earlier one of the same turn (same function,
    same arguments), which is not emitted: small models repeat a forced call until their
    budget runs out. A call to a function already called is held back only while its
    arguments so far could still repeat an earlier call's."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []  # (name, arguments) of finished calls
        self.ended = False
        self._held: list[OutputEvent] | None = None
        self._name = ""
        self._args = ""

    @property
    def calls(self) -> int:
        return len(self.made)

    def filter(self, events: list[OutputEvent]) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        for event in events:
            if self.ended:
                break
            if isinstance(event, CallStarted) and any(n == event.name for n, _ in self.made):
                self._held, self._name, self._args = [event], event.name, ""
            elif self._held is not None and isinstance(event, ArgumentsDelta):
                self._held.append(event)
                self._args += event.delta
                if not self._may_repeat():
                    out += self._release()
            elif self._held is not None and isinstance(event, CallFinished):
                if event.complete and any(
                    n == event.name and _same_arguments(a, event.arguments) for n, a in self.made
                ):
                    self._held = None
                    self.ended = True
                    break
                self._held.append(event)
                out += self._release()
            else:
                out += [*self._release(), event] if self._held is not None else [event]
                self._record(event)
        return out

    def _may_repeat(self) -> bool:
        return any(n == self._name and a.startswith(self._args) for n, a in self.made)

    def _release(self) -> list[OutputEvent]:
        held, self._held = self._held or [], None
        for event in held:
            self._record(event)
        return held

    def _record(self, event: OutputEvent) -> None:
        if isinstance(event, CallFinished):
            self.made.append((event.name, event.arguments))
