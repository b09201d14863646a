"""One provider of a routed model: an engine (usually an upstream server), its prices, its
circuit breaker, and what it has been measured to do."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from respd.engines.base import Engine

BreakerState = Literal["closed", "open", "half_open"]

DEFAULT_BREAKER_FAILURES = 3
DEFAULT_BREAKER_COOLDOWN_SECS = 30.0
DEFAULT_FIRST_BYTE_TIMEOUT_SECS = 60.0
# Weight of the newest measurement in the moving averages of latency and throughput.
SMOOTHING = 0.3


@dataclass
class Breaker:
    """A circuit breaker: after `failures` failures in a row the provider is skipped for
    `cooldown` seconds; then one request probes it (half open), and its outcome closes
    the circuit or opens it for another cool-down."""

    failures: int = DEFAULT_BREAKER_FAILURES
    cooldown: float = DEFAULT_BREAKER_COOLDOWN_SECS
    clock: Callable[[], float] = time.monotonic
    consecutive: int = 0
    opened_at: float | None = None
    probing: bool = False

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        if self.probing or self.clock() - self.opened_at >= self.cooldown:
            return "half_open"
        return "open"

    def available(self) -> bool:
        """Whether a request may go to the provider now (without taking the probe)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self.probing)

    def take(self) -> None:
        """A request is sent: while half open, it is the one probe."""
        if self.state == "half_open":
            self.probing = True

    def succeeded(self) -> None:
        self.consecutive = 0
        self.opened_at = None
        self.probing = False

    def failed(self) -> None:
        self.consecutive += 1
        if self.probing or self.consecutive >= self.failures:
            self.opened_at = self.clock()
        self.probing = False

    def released(self) -> None:
        """A probe that ended neither way (cancelled by its client): another may probe."""
        self.probing = False


@dataclass
class ProviderStats:
    """Counters and moving averages, for `sort`, `/v1/providers` and `/metrics`."""

    requests: int = 0
    succeeded: int = 0
    failed: int = 0
    fallbacks: int = 0  # failures after which another provider was tried
    latency: float | None = None  # seconds to the first output, smoothed
    throughput: float | None = None  # output tokens a second after the first, smoothed
    latency_sum: float = 0.0  # for the Prometheus summary
    latency_count: int = 0
    last_error: str | None = None

    def measured(self, first_output: float, tokens: int, seconds: float) -> None:
        self.latency_sum += first_output
        self.latency_count += 1
        self.latency = _smooth(self.latency, first_output)
        if tokens > 1 and seconds > 0:
            self.throughput = _smooth(self.throughput, tokens / seconds)


def _smooth(average: float | None, value: float) -> float:
    return value if average is None else average + SMOOTHING * (value - average)


@dataclass
class Provider:
    """`name` is what a request's `provider` object names; `endpoint` is this entry's own
    id (one provider may serve several models). Prices are USD per million tokens."""

    name: str
    endpoint: str
    engine: Engine
    price_prompt: float | None = None
    price_completion: float | None = None
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_SECS
    breaker: Breaker = field(default_factory=Breaker)
    stats: ProviderStats = field(default_factory=ProviderStats)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self.price_prompt is None and self.price_completion is None:
            return None
        return (
            prompt_tokens * (self.price_prompt or 0.0)
            + completion_tokens * (self.price_completion or 0.0)
        ) / 1e6

    def price_key(self) -> float:
        """What `sort: price` orders by: unpriced providers last."""
        if self.price_prompt is None and self.price_completion is None:
            return float("inf")
        return (self.price_prompt or 0.0) + (self.price_completion or 0.0)
