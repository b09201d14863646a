"""What media resolution yields: a checked image or a document's text for each media part,
by the request path of the part (`input[0].content[1]`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from respd.engines.base import Image

# Declared types that say nothing: the bytes decide.
GENERIC_TYPES = ("", "application/octet-stream", "binary/octet-stream", "image/*")


@dataclass(frozen=True, eq=False)
class CheckedImage(Image):
    """An image as `check_image` found it: its pixel size rides along for a model that
    cannot see it (the placeholder text names it)."""

    width: int = 0
    height: int = 0


@dataclass(frozen=True)
class FileText:
    """A document lowered to the text the model reads."""

    filename: str
    text: str

    def block(self) -> str:
        """`<file name="NAME">\\nTEXT\\n</file>` (quotes and newlines in NAME neutralised)."""
        name = self.filename.replace('"', "'").replace("\n", " ").replace("\r", " ")
        return f'<file name="{name}">\n{self.text}\n</file>'


Resolved = Image | FileText
Media = Mapping[str, Resolved]
