"""What a request asks of provider routing, and what routing reports back: plain data,
shared by the engines (which route) and the service (which reads a request's `provider`
object and shows the outcome)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Sort = Literal["latency", "throughput", "price"]


@dataclass(frozen=True)
class MaxPrice:
    """The most a request may cost, in USD per million tokens."""

    prompt: float | None = None
    completion: float | None = None


@dataclass(frozen=True)
class Route:
    """A request's provider preferences (the `provider` object): which providers to try,
    in what order, and whether to fall back."""

    order: tuple[str, ...] = ()
    allow_fallbacks: bool = True
    only: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    sort: Sort | None = None
    require_parameters: bool = False
    max_price: MaxPrice | None = None


@dataclass(frozen=True)
class ProviderFailure:
    """A provider tried before the one that answered, and why it was passed over."""

    provider: str
    message: str
    status: int | None = None


@dataclass
class RouteReport:
    """Which provider answered a routed generation and which failed before it; `cost` in
    USD when the provider's prices are configured."""

    provider: str
    failed: list[ProviderFailure] = field(default_factory=list)
    cost: float | None = None

    def wire(self) -> dict[str, object]:
        """The response's `provider` field."""
        return {
            "name": self.provider,
            "failed": [
                {"name": f.provider, "status": f.status, "message": f.message} for f in self.failed
            ],
            "cost": self.cost,
        }


class NoRoute(Exception):
    """No provider may serve the request: 400 when its own preferences rule them all out,
    503 when those left are unavailable (their circuit open, or busy)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
