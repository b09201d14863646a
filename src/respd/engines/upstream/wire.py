"""The Chat Completions request for one generation: the conversation's turns (images as
content parts where they sit), the offered tools with a `tool_choice` for forced calls, a
JSON-Schema answer as `response_format`, and the sampling settings."""

from __future__ import annotations

import base64
import json
from typing import Any

from respd.engines.base import Prompt, SamplingParams
from respd.engines.constraints import NO_PARAMETERS, CallsConstraint, Constraint
from respd.engines.messages import ChatMessage, Part, TextPart

# A rough prompt size for fitting and for `n_tokens` before the upstream reports usage.
CHARS_PER_TOKEN = 4


def estimate(messages: list[ChatMessage]) -> int:
    """A rough prompt size in tokens: text characters over `CHARS_PER_TOKEN`."""
    chars = sum(len(m.text) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
    return chars // CHARS_PER_TOKEN + 4 * len(messages)


def wire_part(part: Part) -> dict[str, Any]:
    """A content part in Chat Completions' shape: text, or an image as a data URI."""
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    url = f"data:{part.mime_type};base64,{base64.b64encode(part.data).decode()}"
    return {"type": "image_url", "image_url": {"url": url, "detail": part.detail}}


def wire_message(message: ChatMessage) -> dict[str, Any]:
    """A conversation turn in Chat Completions' shape: its text, or, when it holds images,
    its parts in order."""
    out: dict[str, Any] = {"role": message.role}
    if message.images:
        out["content"] = [wire_part(part) for part in message.content]
    else:
        out["content"] = message.text
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    return out


def calls_schema(calls: CallsConstraint) -> dict[str, Any]:
    """A JSON Schema whose instances are calls to `calls.tools`: `{"name", "arguments"}`,
    or an array of them when more than one call is allowed."""
    one = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.name]},
                    "arguments": tool.parameters or NO_PARAMETERS,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for tool in calls.tools
        ]
    }
    if calls.max_calls == 1:
        return one
    array: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    if calls.max_calls is not None:
        array["maxItems"] = calls.max_calls
    return array


def _calls_instruction(calls: CallsConstraint) -> ChatMessage:
    described = "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
        for t in calls.tools
    )
    return ChatMessage(
        "system",
        "Call a function: answer with JSON naming the function (`name`) and its `arguments`. "
        f"The functions:\n{described}",
    )


def _schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def request_body(
    model: str, prompt: Prompt, params: SamplingParams, *, emulate_calls: bool = False
) -> dict[str, Any]:
    """The `/v1/chat/completions` body for one generation. With `emulate_calls`, forced
    calls are asked for as a JSON-Schema answer (for an upstream that enforces schemas but
    cannot force tools)."""
    request = prompt.request
    constraint: Constraint | None = prompt.compiled
    calls = constraint.calls if constraint is not None else None
    emulated = emulate_calls and calls is not None
    messages = list(prompt.messages)
    if emulated and calls is not None:
        messages.insert(0, _calls_instruction(calls))
    body: dict[str, Any] = {
        "model": model,
        "messages": [wire_message(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if emulated and calls is not None:
        body["response_format"] = _schema_format("calls", calls_schema(calls))
    else:
        if request.tools:
            body["tools"] = [t.as_template_tool() for t in request.tools]
        if constraint is not None and calls is not None:
            if constraint.forced_calls and len(calls.tools) == 1:
                name = calls.tools[0].name
                body["tool_choice"] = {"type": "function", "function": {"name": name}}
            elif constraint.forced_calls:
                body["tool_choice"] = "required"
            if calls.max_calls == 1:
                body["parallel_tool_calls"] = False
        if constraint is not None and constraint.answer is not None:
            body["response_format"] = _schema_format("answer", constraint.answer)
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "max_tokens": params.max_tokens,
        "presence_penalty": params.presence_penalty or None,
        "frequency_penalty": params.frequency_penalty or None,
        "stop": params.stop or None,
        # Extensions vLLM and llama-server read under these names; sent only when set.
        "ignore_eos": params.ignore_eos or None,
        "min_tokens": params.min_tokens or None,
        "dry_multiplier": params.dry_multiplier,
        "dry_base": params.dry_base,
        "dry_allowed_length": params.dry_allowed_length,
        "dry_penalty_last_n": params.dry_penalty_last_n,
        "dry_sequence_breakers": params.dry_sequence_breakers,
    }
    body.update({k: v for k, v in sampling.items() if v is not None})
    if params.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in params.logit_bias.items()}
    if params.logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = params.logprobs
    return body
