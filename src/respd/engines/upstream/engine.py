"""The upstream engine: one model served by an OpenAI-compatible server, each generation
one streaming request over a pooled `httpx.AsyncClient`.

Closing a stream, or cancelling it, closes its HTTP request, which is how the upstream
learns to stop: `cancel` wakes a stream waiting on the network (for the response or its
next bytes) at once rather than at the upstream's next token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from respd.engines.base import (
    Admitted,
    EngineBusy,
    EngineStats,
    GenerationDone,
    GenerationEvent,
    GenerationStream,
    Prompt,
    PromptRequest,
    PromptTooLong,
    SamplingParams,
)
from respd.engines.constraints import Constraint, ConstraintError, check_schema
from respd.engines.embedding import EmbeddingFailed, EmbeddingInput, Embeddings, normalized
from respd.engines.families.profile import STRUCTURED
from respd.engines.messages import images_on_user_turns
from respd.engines.upstream.stream import (
    StreamReader,
    UpstreamError,
    error_message,
    failure,
    merge_chunks,
    read_sse,
)
from respd.engines.upstream.wire import estimate, request_body

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 32768
DEFAULT_MAX_CONCURRENCY = 64


class _Cancelled(Exception):
    """`cancel` was called while the stream was not waiting on the network."""


class _UpstreamStream:
    def __init__(self, engine: UpstreamEngine, prompt: Prompt, params: SamplingParams) -> None:
        self._engine = engine
        self._cancelled = False
        # The task waiting on the network inside `__anext__`, and whether `cancel` woke it.
        self._waiting: asyncio.Task[Any] | None = None
        self._woken = False
        self._events = self._run(prompt, params)

    def __aiter__(self) -> _UpstreamStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        self._waiting = asyncio.current_task()
        try:
            return await self._events.__anext__()
        finally:
            self._waiting = None

    def cancel(self) -> None:
        """Close the upstream request soon; the stream then ends with a `cancelled` done.
        A reader waiting on the network is woken the way `asyncio.timeout` wakes one: its
        task is cancelled, and the stream takes that cancellation back. Called on the
        event loop's thread, like every use of the stream."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._waiting is not None:
            self._woken = True
            self._waiting.cancel()

    def wrap_up(self) -> bool:
        """An upstream cannot be told to close its output early: it is cancelled."""
        self.cancel()
        return False

    async def aclose(self) -> None:
        await self._events.aclose()

    def _took_back(self) -> bool:
        """A `CancelledError` is this stream's own `cancel` (and is undone), not the
        reader's task being cancelled."""
        task = asyncio.current_task()
        if not self._woken or task is None:
            return False
        self._woken = False
        return task.uncancel() == 0

    def _check(self) -> None:
        if self._cancelled:
            raise _Cancelled

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
            self._check()
            async with engine.http.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode(errors="replace")
                    raise UpstreamError(error_message(text), response.status_code)
                engine.healthy = True
                async for batch in read_sse(response.aiter_bytes()):
                    fed = [reader.feed(data) for data in batch]
                    for chunk in merge_chunks([c for c in fed if c is not None]):
                        stats.generated_tokens += chunk.n_tokens
                        yield chunk
                        self._check()
            calls = reader.flush()
            if calls is not None:
                yield calls
            done = reader.done(prompt.n_tokens)
            stats.prompt_tokens += done.prompt_tokens
            stats.cached_tokens += done.cached_tokens
            stats.completed += 1
            finished = True
            yield done
        except (asyncio.CancelledError, _Cancelled) as exc:
            if isinstance(exc, asyncio.CancelledError) and not self._took_back():
                raise
            stats.cancelled += 1
            finished = True
            yield GenerationDone("cancelled", prompt.n_tokens, reader.chunks)
        except (httpx.HTTPError, UpstreamError, ValueError) as exc:
            stats.failed += 1
            finished = True
            if isinstance(exc, httpx.TransportError):
                engine.healthy = False
                engine.problem = f"{type(exc).__name__}: {exc}"
            log.warning("upstream request failed: %s", exc)
            message, status = failure(exc)
            yield GenerationDone(
                "error", prompt.n_tokens, reader.chunks, error=message, status=status
            )
        finally:
            stats.running -= 1
            if not finished:
                stats.cancelled += 1


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
        self.max_tokens: int | None = None  # the upstream checks input lengths itself
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
        # Chat Completions takes images on user turns only.
        messages = images_on_user_turns(request.messages)
        budget = self.context_window - request.reserve
        n_tokens = estimate(messages)
        if n_tokens > budget and request.truncate:
            # Drop the oldest non-system turns until the estimate fits.
            while n_tokens > budget and any(m.role != "system" for m in messages[:-1]):
                first = next(i for i, m in enumerate(messages) if m.role != "system")
                del messages[first]
                n_tokens = estimate(messages)
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
        self,
        prompt: Prompt,
        params: SamplingParams,
        *,
        cache_key: str | None = None,
        retain: bool = False,
    ) -> GenerationStream:
        if self._stats.running >= self.max_concurrency:
            raise EngineBusy(f"all {self.max_concurrency} upstream connections are busy")
        return _UpstreamStream(self, prompt, params)

    async def prewarm(
        self, prompt: Prompt, *, cache_key: str | None = None, retain: bool = False
    ) -> int:
        """The upstream keeps its own cache, which Chat Completions cannot warm: nothing."""
        return 0

    def stats(self) -> EngineStats:
        self._stats.healthy = self.healthy
        self._stats.problem = self.problem
        return self._stats

    async def embed(self, inputs: list[EmbeddingInput]) -> Embeddings:
        """The upstream's `/embeddings` for the same model (float vectors; `dimensions` is
        applied here, as for a local model)."""
        body = {"model": self.upstream_model, "input": inputs, "encoding_format": "float"}
        try:
            response = await self.http.post("/embeddings", json=body)
            if response.status_code >= 400:
                raise UpstreamError(error_message(response.text), response.status_code)
            data = response.json()
            rows = sorted(data["data"], key=lambda row: row["index"])
            vectors = [normalized([float(x) for x in row["embedding"]]) for row in rows]
            tokens = int((data.get("usage") or {}).get("prompt_tokens") or 0)
        except (httpx.HTTPError, UpstreamError, ValueError, KeyError, TypeError) as exc:
            log.warning("upstream embeddings failed: %s", exc)
            raise EmbeddingFailed(*failure(exc)) from None
        if len(vectors) != len(inputs):
            raise EmbeddingFailed("The upstream engine returned a vector count that differs.", 502)
        return Embeddings(vectors, tokens)

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
