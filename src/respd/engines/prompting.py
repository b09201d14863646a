"""Building a prompt from a conversation, for engines that render a chat template themselves.

One render per request when the conversation fits. When it does not and truncation is on,
the oldest non-system turns are dropped; how many is found by binary search, so a long
history costs O(log n) renders rather than one per dropped turn.

Templates take images on user turns only (`images_on_user_turns` moves the others) and as
text: each image becomes the prompter's `marker` where it sits among its turn's texts, and
the tokenizer puts the image's positions where the marker is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from respd.engines.base import Prompt, PromptError, PromptRequest, PromptTooLong
from respd.engines.chat_template import ChatTemplate, ChatTemplateError
from respd.engines.families.profile import ModelProfile
from respd.engines.families.tools import generic_messages
from respd.engines.messages import ChatMessage, Image, images_on_user_turns, message_images

# Where an image goes in rendered text: llama.cpp's own multimodal marker.
MEDIA_MARKER = "<__media__>"

Tokenizer = Callable[[str, Sequence[Image]], list[int]]


class TemplatePrompter:
    """Renders through a `ChatTemplate` (each image as `marker`), tokenizes with `tokenize`,
    fits `context_window`."""

    def __init__(
        self,
        template: ChatTemplate,
        profile: ModelProfile,
        tokenize: Tokenizer,
        context_window: int,
        marker: str = MEDIA_MARKER,
    ) -> None:
        self.template = template
        self.marker = marker
        self.profile = profile
        self.tokenize = tokenize
        self.context_window = context_window
        self.renders = 0  # how many times a prompt was rendered (tests count them)

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        self.renders += 1
        extra: dict[str, Any] = dict(template_kwargs or {})
        if tools:
            extra["tools"] = tools
        try:
            return self.template.render(
                [m.as_template_dict(self.marker) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except ChatTemplateError as exc:
            raise PromptError(
                f"the model's chat template rejected this conversation: {exc}"
            ) from exc

    def build(self, request: PromptRequest) -> Prompt:
        """Render once, tokenize, fit: a `Prompt` with tokens and images, or an error."""
        window = self.context_window
        messages = images_on_user_turns(request.messages)
        tools = [t.as_template_tool() for t in request.tools] or None
        if not self.profile.tools_native:
            # The template knows nothing of tools: calls, results and the tool list become text.
            messages = generic_messages(messages, tools)
            tools = None
        kwargs = self.profile.template_controls(request.reasoning_effort)

        def attempt(msgs: list[ChatMessage]) -> tuple[str, list[int]]:
            text = self.render(msgs, tools=tools, template_kwargs=kwargs)
            try:
                return text, self.tokenize(text, message_images(msgs))
            except ValueError as exc:
                raise PromptError(f"the input cannot be processed: {exc}") from exc

        def fits(tokens: list[int]) -> bool:
            return len(tokens) + request.reserve <= window

        text, tokens = attempt(messages)
        if not fits(tokens):
            if not request.truncate:
                raise PromptTooLong(len(tokens), window, request.reserve, truncated=False)
            fitted = self._truncate(messages, attempt, fits)
            if fitted is None:
                raise PromptTooLong(len(tokens), window, request.reserve, truncated=True)
            messages, text, tokens = fitted
        return Prompt(
            request=request,
            messages=messages,
            n_tokens=len(tokens),
            reasoning_open=self._opens_reasoning(text),
            tokens=tokens,
            images=message_images(messages),
        )

    def _truncate(
        self,
        messages: list[ChatMessage],
        attempt: Callable[[list[ChatMessage]], tuple[str, list[int]]],
        fits: Callable[[list[int]], bool],
    ) -> tuple[list[ChatMessage], str, list[int]] | None:
        """Drop the fewest oldest non-system turns (never the newest turn) that make it fit;
        None when even dropping them all does not."""
        droppable = [
            i for i, m in enumerate(messages[:-1]) if m.role not in ("system", "developer")
        ]

        def without(k: int) -> list[ChatMessage]:
            gone = set(droppable[:k])
            return [m for i, m in enumerate(messages) if i not in gone]

        def tried(k: int) -> tuple[str, list[int]] | None:
            try:
                text, tokens = attempt(without(k))
            except PromptError:
                return None  # e.g. a tool result left without its call: not a valid cut
            return (text, tokens) if fits(tokens) else None

        best = tried(len(droppable)) if droppable else None
        if best is None:
            return None
        lo, hi = 1, len(droppable)  # invariant: dropping `hi` turns fits
        while lo < hi:
            mid = (lo + hi) // 2
            found = tried(mid)
            if found is not None:
                hi, best = mid, found
            else:
                lo = mid + 1
        text, tokens = best
        return without(hi), text, tokens

    def _opens_reasoning(self, text: str) -> bool:
        style = self.profile.reasoning
        return style is not None and text.rstrip().endswith(style.open)
