"""Lowering content parts into the canonical conversation, the same way for both APIs.

Media parts arrive already resolved (`resolver.py` fetched, decoded and checked them, keyed
by part path), so everything here is pure. A turn's texts and images stay in the order
given, as its parts (which turns may hold images, and how one is written down, is each
engine's business); tool-output parts of no known type stay as one line of JSON; files
become `<file name="…">` text blocks. A model without image input refuses images with a
400, or, with `--image-input-fallback placeholder`, reads one line of text in each one's
place (`placeholder`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from respd.engines.base import ChatMessage, Engine, Image
from respd.engines.messages import Part, TextPart
from respd.protocol.errors import InvalidRequest, MissingParameter
from respd.service.media.parts import FILE_PARTS, IMAGE_PARTS, TEXT_PARTS
from respd.service.media.resolver import CheckedImage, FileText, Media, MediaSettings

_NO_INPUT_PARTS = ("input_audio", "video_url")
IMAGE_DETAILS = ("low", "high", "auto", "original")
NO_EFFECTIVE_INPUT = "Request must include at least one non-empty message content or media input."


def placeholder(image: Image) -> str:
    """The line a model without image input reads where an image was:
    `[image: 640x480 image/png omitted; this model cannot see images]`."""
    size = f"{image.width}x{image.height}" if isinstance(image, CheckedImage) else ""
    about = " ".join(x for x in (size, image.mime_type) if x)
    return f"[image{': ' + about if about else ''} omitted; this model cannot see images]"


@dataclass(frozen=True)
class Lowering:
    """How media parts lower: what the resolution pass found for each part path, and
    whether the model takes images; without image input, whether images become placeholder
    text (`image_placeholders`) instead of a 400."""

    model_id: str
    vision: bool = False
    media: Media = field(default_factory=dict)
    image_placeholders: bool = False

    @classmethod
    def for_engine(cls, engine: Engine, media: Media, settings: MediaSettings | None) -> Lowering:
        """How parts lower for `engine`'s model, images on a text-only one as `settings`'
        fallback says (None: the default 400)."""
        return cls(
            engine.model_id,
            engine.vision,
            media,
            image_placeholders=settings is not None
            and settings.image_input_fallback == "placeholder",
        )

    def image(self, part: dict[str, Any], p: str) -> Image | str:
        """The image to give the model, or the text it reads instead of one."""
        kind = part["type"]
        if kind == "image_url" and isinstance(part.get("image_url"), dict):
            detail, detail_param = part["image_url"].get("detail"), f"{p}.image_url.detail"
        else:
            detail, detail_param = part.get("detail"), f"{p}.detail"
        if detail is not None and detail not in IMAGE_DETAILS:
            raise InvalidRequest(
                f"Invalid value for '{detail_param}': expected one of "
                f"{', '.join(IMAGE_DETAILS)}, got {detail!r}.",
                param=detail_param,
                code="invalid_value",
            )
        resolved = self._resolved(p)
        if not isinstance(resolved, Image):
            raise RuntimeError(f"{p}: expected a resolved image")
        if not self.vision:
            if self.image_placeholders:
                return placeholder(resolved)
            raise InvalidRequest(
                f"The model '{self.model_id}' has no image input; the '{kind}' content at "
                f"'{p}' cannot be processed. Use a vision model.",
                param=p,
                code="unsupported_input",
            )
        return Image(resolved.data, resolved.mime_type, detail or "auto")

    def file_text(self, p: str) -> str:
        resolved = self._resolved(p)
        if not isinstance(resolved, FileText):
            raise RuntimeError(f"{p}: expected a resolved file")
        return resolved.block()

    def _resolved(self, p: str) -> Image | FileText:
        try:
            return self.media[p]
        except KeyError:  # a caller skipped the resolution pass: a bug, not a bad request
            raise RuntimeError(f"media part {p} was not resolved before translation") from None


def _parts(
    content: list[Any], param: str, low: Lowering, *, keep_unknown: bool
) -> tuple[list[Part], list[dict[str, Any]]]:
    """Content parts → texts and images in order, plus (with `keep_unknown`, for tool
    outputs) the parts of no known type, which the caller keeps as JSON text."""
    pieces: list[Part] = []
    unknown: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest(
                f"Invalid type for '{p}': expected an object.", param=p, code="invalid_type"
            )
        kind = part.get("type")
        if kind in TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise MissingParameter(f"{p}.text")
            pieces.append(TextPart(text))
        elif kind == "refusal" and not keep_unknown:
            pieces.append(TextPart(str(part.get("refusal", ""))))
        elif kind in IMAGE_PARTS:
            image = low.image(part, p)
            pieces.append(TextPart(image) if isinstance(image, str) else image)
        elif kind in FILE_PARTS:
            pieces.append(TextPart(low.file_text(p)))
        elif kind in _NO_INPUT_PARTS:
            what = "audio" if kind == "input_audio" else "video"
            raise InvalidRequest(
                f"This server has no {what} input; '{kind}' content cannot be processed "
                f"(model '{low.model_id}').",
                param=f"{p}.type",
                code="unsupported_input",
            )
        elif keep_unknown:
            unknown.append(part)
        else:
            raise InvalidRequest(
                f"Invalid value for '{p}.type': {kind!r} is not a known content part type.",
                param=f"{p}.type",
                code="invalid_value",
            )
    return pieces, unknown


def _check_content(content: Any, param: str) -> None:
    if not isinstance(content, str | list):
        raise InvalidRequest(
            f"Invalid type for '{param}': expected a string or an array of content parts.",
            param=param,
            code="invalid_type",
        )


def lower_message(role: str, content: Any, param: str, low: Lowering) -> ChatMessage:
    """A message's content → its turn, each image where it was among the texts."""
    _check_content(content, param)
    if isinstance(content, str):
        return ChatMessage(role, content)
    parts, _ = _parts(content, param, low, keep_unknown=False)
    return ChatMessage(role, parts)


def lower_tool_output(output: Any, param: str, low: Lowering) -> list[Part]:
    """A tool result → the tool turn's parts.

    A string is the text as it is. An array: text parts (and files, as text) and images in
    order, then the parts of no known type as one line of JSON."""
    _check_content(output, param)
    if isinstance(output, str):
        return [TextPart(output)] if output else []
    parts, unknown = _parts(output, param, low, keep_unknown=True)
    if unknown:
        parts.append(TextPart(json.dumps(unknown, separators=(",", ":"), ensure_ascii=False)))
    return parts


def require_effective_input(messages: list[ChatMessage], param: str = "input") -> None:
    """Reject a conversation with nothing in it for the model to answer."""
    if not any(m.text.strip() or m.tool_calls or m.reasoning or m.images for m in messages):
        raise InvalidRequest(NO_EFFECTIVE_INPUT, param=param)
