"""What running one server-side tool call gives back, whatever the tool."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

JSON = dict[str, Any]


@dataclass(frozen=True)
class Source:
    """Something an answer may cite: a file a search found, or a web page."""

    kind: Literal["file", "url"]
    ref: str  # a file id, or a URL
    title: str  # the file's name, or the page's title
    text: str  # what the model was shown of it


@dataclass
class Outcome:
    """A finished call: the fields its item gains (`output`, `error`, `results`, an action's
    sources), the text the model reads as the call's result, and what the answer may cite.
    `failed` calls still give the model a text: what went wrong."""

    status: Literal["completed", "failed"]
    text: str
    fields: JSON = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)

    @classmethod
    def failure(cls, message: str, **fields: Any) -> Outcome:
        return cls("failed", f"The tool call failed: {message}", dict(fields))
