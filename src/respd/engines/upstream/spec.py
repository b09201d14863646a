"""Where one upstream model lives and what respd calls it: an `--upstream` entry, or a
table of `--upstreams-file`, with the same fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The options after `ALIAS=URL`, and the keys of a file entry besides `alias` and `url`.
OPTIONS = (
    "model",
    "key",
    "ctx",
    "vision",
    "tool_choice",
    "response_format",
    "provider",
    "model_id",
    "price_prompt",
    "price_completion",
    "concurrency",
    "timeout",
)


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).lower() in ("1", "true", "yes", "on")


def _positive_int(key: str, value: object) -> int:
    text = str(value)
    if not (text.isdigit() and int(text) > 0):
        raise ValueError(f"{key} must be a positive whole number, not {value!r}")
    return int(text)


def _non_negative(key: str, value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        raise ValueError(f"{key} must be a number, not {value!r}") from None
    if not number >= 0:
        raise ValueError(f"{key} must not be negative, not {value!r}")
    return number


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream model. `alias` is the entry's own id; `model_id`, when set, is the
    public id it serves under together with every entry naming the same one, and
    `provider` the name requests route by (default: the alias). Prices are USD per
    million tokens; `concurrency` caps its requests at once; `timeout` is the seconds
    its first output may take before the next provider is tried."""

    url: str
    alias: str | None = None
    model: str | None = None
    api_key: str | None = None
    context_window: int | None = None
    vision: bool = False
    # What the upstream can enforce: a forced `tool_choice`, a `response_format` schema.
    forces_tools: bool = True
    enforces_schemas: bool = True
    provider: str | None = None
    model_id: str | None = None
    price_prompt: float | None = None
    price_completion: float | None = None
    concurrency: int | None = None
    timeout: float | None = None

    @property
    def routed(self) -> bool:
        """Whether the entry joins provider routing (it names a provider or a public id)."""
        return self.provider is not None or self.model_id is not None

    @property
    def public_id(self) -> str | None:
        return self.model_id or self.alias

    @property
    def provider_name(self) -> str:
        return self.provider or self.alias or self.url

    @classmethod
    def parse(cls, text: str) -> UpstreamSpec:
        """`ALIAS=URL[,OPTION=VALUE]...`, the options as in `OPTIONS`."""
        head, *options = [p.strip() for p in text.split(",")]
        alias, eq, url = head.partition("=")
        if not eq or not alias:
            raise ValueError("expected ALIAS=http(s)://HOST[:PORT]/v1 first")
        fields: dict[str, str] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or key not in OPTIONS:
                raise ValueError(f"unknown option {option!r} ({', '.join(OPTIONS)})")
            fields[key] = value
        return cls.from_mapping({"alias": alias, "url": url, **fields})

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> UpstreamSpec:
        """An entry from `alias`, `url` and the `OPTIONS` keys (a file's table)."""
        unknown = sorted(set(entry) - {"alias", "url", *OPTIONS})
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} ({', '.join(OPTIONS)})")
        url = str(entry.get("url", ""))
        alias = entry.get("alias")
        if not alias or not url.startswith(("http://", "https://")):
            raise ValueError("expected an alias and an http(s)://HOST[:PORT]/v1 url")

        def text(key: str) -> str | None:
            value = entry.get(key)
            return None if value is None or value == "" else str(value)

        def number(key: str) -> float | None:
            value = entry.get(key)
            return None if value is None else _non_negative(key, value)

        def count(key: str) -> int | None:
            value = entry.get(key)
            return None if value is None else _positive_int(key, value)

        timeout = number("timeout")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, not {entry['timeout']!r}")
        return cls(
            url,
            alias=str(alias),
            model=text("model"),
            api_key=text("key"),
            context_window=count("ctx"),
            vision=_flag(entry.get("vision", False)),
            forces_tools=_flag(entry.get("tool_choice", True)),
            enforces_schemas=_flag(entry.get("response_format", True)),
            provider=text("provider"),
            model_id=text("model_id"),
            price_prompt=number("price_prompt"),
            price_completion=number("price_completion"),
            concurrency=count("concurrency"),
            timeout=timeout,
        )
