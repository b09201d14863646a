"""A model served by several providers: each generation goes to the first provider the
request's preferences and the providers' health allow, and falls back to the next when one
fails before its first output.

Fallback never duplicates output: a provider is committed to once its first chunk is
handed on, and a failure after that ends the generation as the provider's error. Before
it, a connection error, a timeout, a 5xx, a 408 or a 429 moves on to the next provider
with the same prompt (each was prepared once, at `prepare`); the upstream's other 4xx are
the request's own fault and end it as they are.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from respd.engines.base import (
    Admitted,
    EngineBusy,
    EngineStats,
    GenerationDone,
    GenerationEvent,
    GenerationStream,
    Prompt,
    PromptError,
    PromptRequest,
    PromptTooLong,
    SamplingParams,
    TokenChunk,
)
from respd.engines.constraints import Constraint, ConstraintError, SchemaRejected
from respd.engines.route import NoRoute, ProviderFailure, Route, RouteReport
from respd.engines.routing.provider import Provider


def retryable(status: int | None) -> bool:
    """A failure another provider may not have: unreachable, timed out, overloaded, 5xx."""
    return status is None or status in (408, 429) or status >= 500


def _native(provider: Provider, constraint: Constraint | None) -> bool:
    """The provider enforces the request's constraint itself (not by emulation)."""
    emulates = getattr(provider.engine, "emulates_calls", None)
    return constraint is None or emulates is None or not emulates(constraint)


@dataclass
class _Plan:
    """The providers a prepared generation may use, in order, each with its own prompt
    (one alone when the request allows no fallback)."""

    entries: list[tuple[Provider, Prompt]]


class RoutedEngine:
    """One public model id over `providers` (in their configured order)."""

    def __init__(self, model_id: str, providers: Sequence[Provider]) -> None:
        if not providers:
            raise ValueError("a routed model needs at least one provider")
        self.model_id = model_id
        self.providers = list(providers)
        first = self.providers[0].engine
        self.profile = first.profile
        self.default_sampling: dict[str, float] = {}
        self.n_vocab: int | None = None
        self.max_tokens: int | None = None
        # The widest window: a prompt too long for a provider leaves it out (`prepare`).
        self.context_window = max(p.engine.context_window for p in self.providers)
        self.vision = any(p.engine.vision for p in self.providers)

    def provider_names(self) -> list[str]:
        return list(dict.fromkeys(p.name for p in self.providers))

    # -- choosing providers ---------------------------------------------------------------

    def candidates(self, route: Route) -> list[Provider]:
        """The providers `route` allows, in the order to try them; raises `NoRoute`."""
        chosen = [
            p
            for p in self.providers
            if (route.only is None or p.name in route.only) and p.name not in route.ignore
        ]
        limit = route.max_price
        if limit is not None:
            chosen = [
                p
                for p in chosen
                if (limit.prompt is None or (p.price_prompt or 0.0) <= limit.prompt)
                and (limit.completion is None or (p.price_completion or 0.0) <= limit.completion)
            ]
        if not chosen:
            raise NoRoute(
                f"No provider of {self.model_id} matches the request's provider preferences "
                f"(providers: {', '.join(self.provider_names())})."
            )
        if route.sort is not None:
            chosen.sort(key=_sort_key(route))
        if route.order:
            rank = {name: i for i, name in enumerate(route.order)}
            named = sorted((p for p in chosen if p.name in rank), key=lambda p: rank[p.name])
            chosen = named + [p for p in chosen if p.name not in rank]
        healthy = [p for p in chosen if p.breaker.available()]
        if not healthy:
            raise NoRoute(
                f"Every provider of {self.model_id} the request allows is unavailable "
                "(circuit open after repeated failures); retry shortly.",
                status=503,
            )
        return healthy if route.allow_fallbacks else healthy[:1]

    # -- the engine protocol ----------------------------------------------------------------

    def check_schema(self, schema: dict[str, Any]) -> None:
        errors: list[SchemaRejected] = []
        for provider in self.providers:
            try:
                provider.engine.check_schema(schema)
                return
            except SchemaRejected as exc:
                errors.append(exc)
        raise errors[0]

    async def prepare(self, request: PromptRequest) -> Prompt:
        """A prompt per provider the request may use; those that cannot take it (too long
        for their window, a constraint they cannot enforce) are left out, and when none
        can, the first one's reason is the request's error."""
        route = request.route or Route()
        entries: list[tuple[Provider, Prompt]] = []
        refusals: list[Exception] = []
        for provider in self.candidates(route):
            if route.require_parameters and not _native(provider, request.constraint):
                refusals.append(
                    NoRoute(
                        f"No provider of {self.model_id} can honour the request's "
                        "tool_choice/response_format itself (require_parameters)."
                    )
                )
                continue
            try:
                entries.append((provider, await provider.engine.prepare(request)))
            except (ConstraintError, PromptTooLong, PromptError) as exc:
                refusals.append(exc)
        if not entries:
            raise refusals[0]
        first = entries[0][1]
        plan = _Plan(entries)
        return Prompt(
            request,
            first.messages,
            first.n_tokens,
            reasoning_open=first.reasoning_open,
            compiled=plan,
        )

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        retain: bool = False,
    ) -> GenerationStream:
        plan: _Plan = prompt.compiled
        return _RoutedStream(plan, params, cache_key=cache_key, retain=retain)

    async def prewarm(
        self, prompt: Prompt, *, cache_key: str | None = None, retain: bool = False
    ) -> int:
        return 0

    def stats(self) -> EngineStats:
        total = EngineStats()
        problems = []
        for provider in self.providers:
            s = provider.engine.stats()
            total.running += s.running
            total.queued += s.queued
            total.completed += s.completed
            total.cancelled += s.cancelled
            total.failed += s.failed
            total.generated_tokens += s.generated_tokens
            total.prompt_tokens += s.prompt_tokens
            total.cached_tokens += s.cached_tokens
            if not s.healthy:
                problems.append(f"{provider.endpoint}: {s.problem or 'unhealthy'}")
        # Serving while any provider can: the others are fallen back from.
        total.healthy = len(problems) < len(self.providers)
        total.problem = "; ".join(problems) or None
        return total

    async def probe(self) -> bool:
        probes = [getattr(p.engine, "probe", None) for p in self.providers]
        await asyncio.gather(*(probe() for probe in probes if probe is not None))
        return self.stats().healthy

    def close(self) -> None:
        for provider in self.providers:
            provider.engine.close()


def _sort_key(route: Route) -> Any:
    """Unmeasured (or unpriced) providers sort after measured ones; ties keep the
    configured order (`list.sort` is stable)."""
    if route.sort == "price":
        return lambda p: p.price_key()
    if route.sort == "latency":
        return lambda p: (p.stats.latency is None, p.stats.latency or 0.0)
    return lambda p: (p.stats.throughput is None, -(p.stats.throughput or 0.0))


class _RoutedStream:
    """The generation on one provider after another, until one gives output (or the
    last fails)."""

    def __init__(
        self, plan: _Plan, params: SamplingParams, *, cache_key: str | None, retain: bool
    ) -> None:
        self._pending = deque(plan.entries)
        self._params = params
        self._cache_key = cache_key
        self._retain = retain
        self._failed: list[ProviderFailure] = []
        self._cancelled = False
        self._current: tuple[Provider, GenerationStream] | None = None
        busy = self._open_next()
        if self._current is None:
            raise EngineBusy(busy or "no provider is available")
        self._events: AsyncGenerator[GenerationEvent, None] = self._run()

    def __aiter__(self) -> _RoutedStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        return await self._events.__anext__()

    def cancel(self) -> None:
        self._cancelled = True
        if self._current is not None:
            self._current[1].cancel()

    def wrap_up(self) -> bool:
        if self._current is None:
            self.cancel()
            return False
        return self._current[1].wrap_up()

    async def aclose(self) -> None:
        await self._events.aclose()

    def _open_next(self) -> str | None:
        """Start the next provider that can take the generation now; returns why the last
        one skipped could not (busy, or its circuit open meanwhile)."""
        self._current = None
        reason = None
        while self._pending and not self._cancelled:
            provider, prompt = self._pending.popleft()
            if not provider.breaker.available():
                reason = f"the circuit of provider {provider.name} is open"
                continue
            try:
                stream = provider.engine.generate(
                    prompt, self._params, cache_key=self._cache_key, retain=self._retain
                )
            except EngineBusy as exc:
                reason = f"provider {provider.name}: {exc}"
                continue
            provider.breaker.take()
            provider.stats.requests += 1
            self._current = (provider, stream)
            return None
        return reason

    async def _run(self) -> AsyncGenerator[GenerationEvent, None]:
        yield Admitted()
        done: GenerationDone | None = None
        while self._current is not None:
            provider, stream = self._current
            try:
                done = None
                async for event in self._attempt(provider, stream):
                    if isinstance(event, GenerationDone):
                        done = event
                    else:
                        yield event
            finally:
                await stream.aclose()
            if done is not None:
                yield done
                return
        # Every provider failed before giving output, or the last one left was skipped.
        failed = self._failed
        last = failed[-1] if failed else None
        message = last.message if last is not None else "no provider is available"
        name = last.provider if last is not None else ""
        yield GenerationDone(
            "cancelled" if self._cancelled else "error",
            0,
            0,
            error=None if self._cancelled else message,
            status=None if self._cancelled else (last.status if last else 503),
            route=RouteReport(name, failed[:-1] if last else []),
        )

    async def _attempt(
        self, provider: Provider, stream: GenerationStream
    ) -> AsyncIterator[GenerationEvent]:
        """One provider's events; ends without a `GenerationDone` when the next provider
        is to be tried (and opened)."""
        started = time.monotonic()
        before = list(self._failed)  # the providers that failed before this one
        first_at: float | None = None
        produced = 0
        events = stream.__aiter__()
        while True:
            try:
                if first_at is None:
                    async with asyncio.timeout(provider.first_byte_timeout):
                        event = await events.__anext__()
                else:
                    event = await events.__anext__()
            except StopAsyncIteration:
                event = GenerationDone("error", 0, produced, error="the stream ended early")
            except TimeoutError:
                event = GenerationDone(
                    "error",
                    0,
                    0,
                    error=f"no output within {provider.first_byte_timeout:g}s",
                    status=504,
                )
            except Exception as exc:  # an engine that raises instead of ending
                event = GenerationDone("error", 0, produced, error=str(exc), status=502)
            if isinstance(event, Admitted):
                continue
            if isinstance(event, TokenChunk):
                if first_at is None:
                    first_at = time.monotonic()
                produced += event.n_tokens
                yield event
                continue
            done = event
            if done.finish_reason == "error":
                if first_at is None and retryable(done.status) and self._pending:
                    self._fail(provider, done)
                    provider.stats.fallbacks += 1
                    self._open_next()
                    return  # on to the next provider
                if retryable(done.status):
                    self._fail(provider, done)
                else:  # the request's own fault: the provider is fine
                    provider.breaker.released()
                    provider.stats.failed += 1
            elif done.finish_reason == "cancelled":
                provider.breaker.released()
            else:
                provider.breaker.succeeded()
                provider.stats.succeeded += 1
                if first_at is not None:
                    now = time.monotonic()
                    provider.stats.measured(first_at - started, produced, now - first_at)
            cost = provider.cost(done.prompt_tokens, done.completion_tokens)
            report = RouteReport(provider.name, before, cost)
            yield replace(done, route=report)
            return

    def _fail(self, provider: Provider, done: GenerationDone) -> None:
        provider.breaker.failed()
        provider.stats.failed += 1
        provider.stats.last_error = done.error
        self._failed.append(ProviderFailure(provider.name, done.error or "failed", done.status))
