"""Models served by several providers: routing by a request's preferences, fallback before
the first output, circuit breakers and measured latency and throughput per provider."""

from respd.engines.routing.engine import RoutedEngine, retryable
from respd.engines.routing.provider import Breaker, Provider, ProviderStats

__all__ = ["Breaker", "Provider", "ProviderStats", "RoutedEngine", "retryable"]
