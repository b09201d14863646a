"""Chat templates: the model's own Jinja template, rendered in a sandbox.

GGUF files carry the template their trainers wrote (`tokenizer.chat_template`). These are
the same Hugging Face templates transformers renders, so we give them the same environment:
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text, and trimmed blocks.
The sandbox stops a hostile template from reaching Python internals.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML, used when a model ships no template at all.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(Exception):
    """The template raised or could not be compiled."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


_ENVIRONMENT = _environment()


@functools.lru_cache(maxsize=32)
def _compiled(source: str) -> Template:
    """One compiled template per source: compiling a model's template costs tens of
    milliseconds, and a rendered template keeps no state between renders."""
    return _ENVIRONMENT.from_string(source)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = _compiled(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **kwargs,
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template error: {exc}") from exc
