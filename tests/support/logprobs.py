"""Reading logprobs off SDK-typed Responses output."""

from __future__ import annotations

from typing import Any

from openai.types.responses import ResponseOutputMessage
from openai.types.responses.response_output_text import Logprob as OutputTextLogprob


def part_logprobs(resp: Any) -> list[OutputTextLogprob]:
    return message_logprobs(resp.output[0])


def message_logprobs(msg: Any) -> list[OutputTextLogprob]:
    assert isinstance(msg, ResponseOutputMessage)
    assert msg.content[0].type == "output_text"
    return list(msg.content[0].logprobs or [])
