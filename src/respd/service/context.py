"""Fit a conversation into the model's context window (Responses `truncation`)."""

from __future__ import annotations

from typing import Any

from respd.engines.base import ChatMessage, Engine, Image
from respd.engines.chat_template import ChatTemplateError
from respd.protocol.errors import ContextLengthExceeded, InvalidRequest


def message_images(messages: list[ChatMessage]) -> list[Image]:
    """Every image of the conversation, in prompt order."""
    return [image for m in messages for image in m.images]


def render_tokens(
    engine: Engine,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    try:
        prompt = engine.render_prompt(messages, tools=tools, template_kwargs=template_kwargs)
    except ChatTemplateError as exc:
        raise InvalidRequest(
            f"The model's chat template rejected this conversation: {exc}", param="input"
        ) from exc
    try:
        return engine.tokenize(prompt, message_images(messages))
    except ValueError as exc:
        raise InvalidRequest(f"The input cannot be processed: {exc}.", param="input") from exc


def fit_to_context(
    engine: Engine,
    messages: list[ChatMessage],
    *,
    reserve: int,
    truncation: str,
    param: str = "input",
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[ChatMessage], list[int]]:
    """Render and tokenize `messages` so that prompt + `reserve` tokens fit the window.

    With `truncation="auto"` the oldest non-system turns are dropped (system turns,
    which include `instructions`, are kept, and so is the newest turn) until it fits;
    otherwise an overflow is a 400 `context_length_exceeded`.
    """
    window = engine.context_window
    if reserve >= window:
        raise ContextLengthExceeded(
            f"max_output_tokens ({reserve}) must be smaller than the model's context window "
            f"of {window} tokens.",
            param="max_output_tokens",
        )
    messages = list(messages)
    tokens = render_tokens(engine, messages, tools, template_kwargs)
    while len(tokens) + reserve > window:
        if truncation != "auto":
            raise ContextLengthExceeded(
                f"This model's maximum context length is {window} tokens. However, your "
                f"request needs {len(tokens)} input tokens plus {reserve} for output. "
                "Shorten the input, lower max_output_tokens, or set truncation to 'auto'.",
                param=param,
            )
        droppable = [
            i for i, m in enumerate(messages[:-1]) if m.role not in ("system", "developer")
        ]
        if not droppable:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {window} tokens; even after "
                f"truncating older turns the input needs {len(tokens)} tokens plus {reserve} "
                "for output.",
                param=param,
            )
        del messages[droppable[0]]
        tokens = render_tokens(engine, messages, tools, template_kwargs)
    return messages, tokens
