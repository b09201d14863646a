"""Responses API input items → the canonical conversation (a list of `ChatMessage`).

Errors name the exact path of the offending value (`input[2].content[0].type`), as OpenAI's
do. Content parts lower through `media/lowering.py`, as Chat Completions' do.
"""

from __future__ import annotations

import json
from typing import Any

from respd.engines.base import ChatMessage, ToolCall
from respd.protocol.errors import InvalidRequest, MissingParameter, Unsupported
from respd.service.media.lowering import Lowering, lower_message, lower_tool_output
from respd.service.sealing import Sealer, Unsealable
from respd.service.tools.definitions import APPLY_PATCH, LOCAL_SHELL, SHELL, namespaced
from respd.service.tools.hosted.calls import server_call
from respd.service.tools.tool_search import SEARCH_NAME, output_text

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
# Item types that a later piece of work implements; until then they are a named 400.
_NOT_YET_ITEMS = {
    "item_reference": "stored items",
}
SUMMARY_HEADER = "A summary of the conversation so far:"
# What an assistant message's `phase` may say (a preamble before calls, or the answer).
PHASES = (None, "commentary", "final_answer")
# The record of a hosted tool's work that the model is not shown: the work of tools this
# server does not run (a client may replay OpenAI's), a listing of an MCP server's tools
# (offered as functions instead), and an approval asked or given (the call it allowed is
# an `mcp_call` item of its own).
_HOSTED_CALL_ITEMS = frozenset(
    {
        "image_generation_call",
        "code_interpreter_call",
        "computer_call",
        "computer_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
    }
)
# Calls this server runs: each is shown as the function call the model made, then its
# result.
_SERVER_CALL_ITEMS = frozenset({"mcp_call", "file_search_call", "web_search_call"})


def _role(value: Any, param: str) -> str:
    if value not in MESSAGE_ROLES:
        raise InvalidRequest(
            f"Invalid value for '{param}': expected one of {', '.join(MESSAGE_ROLES)}, "
            f"got {value!r}.",
            param=param,
            code="invalid_value",
        )
    # Templates know system, user and assistant; developer is OpenAI's new name for system.
    return "system" if value == "developer" else value


def summary_turn(summary: str) -> ChatMessage:
    """The prompt turn that stands for the turns a compaction summary replaced."""
    return ChatMessage("user", f"{SUMMARY_HEADER}\n{summary}")


def check_item_shapes(items: Any, prefix: str = "input") -> None:
    """Each item an object whose `type`, when given, is a string: checked before anything
    (media resolution included) reads the items."""
    if items is None or isinstance(items, str):
        return
    if not isinstance(items, list):
        raise InvalidRequest(
            f"Invalid type for '{prefix}': expected a string or an array of input items.",
            param=prefix,
            code="invalid_type",
        )
    for i, item in enumerate(items):
        param = f"{prefix}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(
                f"Invalid type for '{param}': expected an object.", param=param, code="invalid_type"
            )
        if "type" in item and not isinstance(item["type"], str):
            raise InvalidRequest(
                f"Invalid type for '{param}.type': expected a string.",
                param=f"{param}.type",
                code="invalid_type",
            )


def input_to_messages(
    items: str | list[dict[str, Any]] | None,
    *,
    lowering: Lowering,
    prior: list[ChatMessage] | None = None,
    prefix: str = "input",
    sealer: Sealer | None = None,
    results: dict[str, str] | None = None,
) -> list[ChatMessage]:
    """Translate the Responses `input` field. `prior` is the history it continues (from
    `previous_response_id` or a conversation): a `function_call_output` may answer a call
    made there. `lowering` carries the media the resolution pass found (`media/resolver.py`)
    and the model's image capability; `sealer` opens the sealed state (compaction items,
    encrypted reasoning) this server handed out. `results`: the full result text of
    server-run calls by item id, where the item keeps less of it than the model read."""
    low = lowering
    check_item_shapes(items, prefix)
    if items is None:
        return []
    if isinstance(items, str):
        return [ChatMessage("user", items)]
    messages: list[ChatMessage] = []
    for i, item in enumerate(items):
        param = f"{prefix}[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, param, low))
        elif kind == "function_call":
            _function_call(item, param, messages)
        elif kind == "custom_tool_call":
            _custom_tool_call(item, param, messages)
        elif kind in _CLIENT_CALLS:
            _client_call(item, param, messages)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            _function_call_output(item, param, messages, low=low, prior=prior or [])
        elif kind == "tool_search_call":
            _search_call(item, param, messages)
        elif kind == "tool_search_output":
            _search_output(item, param, messages, prior or [])
        elif kind == "local_shell_call_output":
            _local_shell_output(item, param, messages, prior=prior or [])
        elif kind == "shell_call_output":
            text = _shell_output_text(item, param)
            _client_output(item, param, messages, prior or [], SHELL, text)
        elif kind == "apply_patch_call_output":
            text = f"{item.get('status') or 'completed'}: {item.get('output') or ''}".strip()
            _client_output(item, param, messages, prior or [], APPLY_PATCH, text)
        elif kind in _SERVER_CALL_ITEMS:
            call, text = server_call(item, (results or {}).get(str(item.get("id"))))
            _add_call(call, messages)
            messages.append(ChatMessage("tool", text, tool_call_id=call.id, name=call.name))
        elif kind in _HOSTED_CALL_ITEMS or kind == "compaction_trigger":
            # a trigger is met only in a stored compaction turn's input: its output (the
            # compaction item) follows it and stands for what it asked
            continue
        elif kind == "reasoning":
            text = _reasoning_text(item, param, sealer)
            messages.append(ChatMessage(_REASONING, "", reasoning=text))
        elif kind == "compaction":
            summary = _unseal(item, param, "compaction", sealer).get("summary")
            messages.append(summary_turn(str(summary)))
        elif kind in _NOT_YET_ITEMS:
            raise Unsupported(
                f"Input items of type '{kind}' ({_NOT_YET_ITEMS[kind]}) are not supported by "
                "this server yet.",
                param=f"{param}.type",
            )
        else:
            raise InvalidRequest(
                f"Invalid value for '{param}.type': {kind!r} is not a supported input item type.",
                param=f"{param}.type",
                code="invalid_value",
            )
    return _attach_reasoning(messages)


def _message(item: dict[str, Any], param: str, low: Lowering) -> ChatMessage:
    if "role" not in item:
        raise MissingParameter(f"{param}.role")
    if "content" not in item:
        raise MissingParameter(f"{param}.content")
    role = _role(item["role"], f"{param}.role")
    if item.get("phase") not in PHASES:
        raise InvalidRequest(
            f"Invalid value for '{param}.phase': expected 'commentary' or "
            f"'final_answer', got {item['phase']!r}.",
            param=f"{param}.phase",
            code="invalid_value",
        )
    return lower_message(role, item["content"], f"{param}.content", low)


def _required_str(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise MissingParameter(f"{param}.{key}")
    return value


def _namespace(item: dict[str, Any], param: str) -> str | None:
    value = item.get("namespace")
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(
            f"Invalid type for '{param}.namespace': expected a string.",
            param=f"{param}.namespace",
            code="invalid_type",
        )
    return value


def _function_call(item: dict[str, Any], param: str, messages: list[ChatMessage]) -> None:
    """An earlier call by the assistant, under the name the model is shown for it."""
    arguments = item.get("arguments")
    name = namespaced(_namespace(item, param), _required_str(item, "name", param))
    call_id = _required_str(item, "call_id", param)
    _add_call(ToolCall(call_id, name, arguments if isinstance(arguments, str) else "{}"), messages)


def _custom_tool_call(item: dict[str, Any], param: str, messages: list[ChatMessage]) -> None:
    """A custom tool's call, as the one-argument function call the model writes for it."""
    text = item.get("input")
    if not isinstance(text, str):
        raise MissingParameter(f"{param}.input")
    name = namespaced(_namespace(item, param), _required_str(item, "name", param))
    call_id = _required_str(item, "call_id", param)
    _add_call(ToolCall(call_id, name, json.dumps({"input": text})), messages)


# Per call item of a client-run tool: the tool's name, the field holding the call, and the
# keys of that field the model's function takes.
_CLIENT_CALLS = {
    "local_shell_call": (LOCAL_SHELL, "action", ("command", "working_directory", "timeout_ms")),
    "shell_call": (SHELL, "action", ("commands", "timeout_ms")),
    "apply_patch_call": (APPLY_PATCH, "operation", ("type", "path", "diff")),
}


def _client_call(item: dict[str, Any], param: str, messages: list[ChatMessage]) -> None:
    """A client-run tool's earlier call, as the function call the model writes for it."""
    tool, key, names = _CLIENT_CALLS[item["type"]]
    value = item.get(key)
    if not isinstance(value, dict):
        raise MissingParameter(f"{param}.{key}")
    args = {k: v for k, v in value.items() if k in names and v is not None}
    call_id = _required_str(item, "call_id", param)
    _add_call(ToolCall(call_id, tool, json.dumps(args)), messages)


def _local_shell_output(
    item: dict[str, Any], param: str, messages: list[ChatMessage], *, prior: list[ChatMessage]
) -> None:
    """A shell command's output. It names its call by `call_id` or by `id`; failing both,
    it answers the latest shell call."""
    calls = [c for m in (*prior, *messages) for c in m.tool_calls if c.name == LOCAL_SHELL]
    wanted = {item.get("call_id"), item.get("id")}
    match = next((c for c in reversed(calls) if c.id in wanted), calls[-1] if calls else None)
    if match is None:
        raise InvalidRequest(
            "No local shell call found for this local_shell_call_output.",
            param=f"{param}.call_id",
            code="invalid_value",
        )
    output = item.get("output")
    if not isinstance(output, str):
        raise MissingParameter(f"{param}.output")
    messages.append(ChatMessage("tool", output, tool_call_id=match.id, name=LOCAL_SHELL))


def _shell_output_text(item: dict[str, Any], param: str) -> str:
    """What the commands printed, each chunk's stdout, stderr and how it ended."""
    chunks = item.get("output")
    if not isinstance(chunks, list):
        raise MissingParameter(f"{param}.output")
    parts: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        parts += [str(chunk[k]) for k in ("stdout", "stderr") if chunk.get(k)]
        outcome = chunk.get("outcome")
        if isinstance(outcome, dict) and outcome.get("type") == "timeout":
            parts.append("[timed out]")
        elif isinstance(outcome, dict) and outcome.get("exit_code") is not None:
            parts.append(f"[exit code {outcome['exit_code']}]")
    return "\n".join(parts)


def _client_output(
    item: dict[str, Any],
    param: str,
    messages: list[ChatMessage],
    prior: list[ChatMessage],
    tool: str,
    text: str,
) -> None:
    """A client-run tool's result, for the call of that tool it names by `call_id`."""
    call_id = _required_str(item, "call_id", param)
    calls = {c.id for m in (*prior, *messages) for c in m.tool_calls if c.name == tool}
    if call_id not in calls:
        raise InvalidRequest(
            f"No {tool} call found with call_id {call_id!r}.",
            param=f"{param}.call_id",
            code="invalid_value",
        )
    messages.append(ChatMessage("tool", text, tool_call_id=call_id, name=tool))


def _search_call(item: dict[str, Any], param: str, messages: list[ChatMessage]) -> None:
    """A tool search, as the call of the search function the model wrote; a hosted one
    has no call id, so its item id stands in."""
    arguments = item.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidRequest(
            f"Invalid type for '{param}.arguments': expected an object.",
            param=f"{param}.arguments",
            code="invalid_type",
        )
    call_id = item.get("call_id") or item.get("id") or f"tsc_{len(messages)}"
    _add_call(ToolCall(str(call_id), SEARCH_NAME, json.dumps(arguments or {})), messages)


def _search_output(
    item: dict[str, Any], param: str, messages: list[ChatMessage], prior: list[ChatMessage]
) -> None:
    """The tools a search loaded, as its result: for the search call it names, else the
    first one not yet answered (hosted searches' outputs follow their calls, in order). The
    tools
    themselves join the offered tools (`tool_search.load_found`)."""
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise MissingParameter(f"{param}.tools")
    turns = [*prior, *messages]
    answered = {m.tool_call_id for m in turns if m.role == "tool"}
    calls = [c for m in turns for c in m.tool_calls if c.name == SEARCH_NAME]
    wanted = item.get("call_id")
    if wanted:
        match = next((c for c in calls if c.id == wanted), None)
    else:
        match = next((c for c in calls if c.id not in answered), None)
    if match is None:
        return  # tools loaded with no search in the history: nothing to answer
    text = output_text([t for t in tools if isinstance(t, dict)])
    messages.append(ChatMessage("tool", text, tool_call_id=match.id, name=SEARCH_NAME))


def _add_call(call: ToolCall, messages: list[ChatMessage]) -> None:
    """Consecutive calls share one assistant turn."""
    last = messages[-1] if messages else None
    empty = last is not None and not (last.text or last.images)
    if last is not None and last.role == "assistant" and (last.tool_calls or empty):
        last.tool_calls.append(call)
    else:
        messages.append(ChatMessage("assistant", "", tool_calls=[call]))


def _function_call_output(
    item: dict[str, Any],
    param: str,
    messages: list[ChatMessage],
    *,
    low: Lowering,
    prior: list[ChatMessage],
) -> None:
    call_id = _required_str(item, "call_id", param)
    calls = {c.id: c for m in (*prior, *messages) for c in m.tool_calls}
    if call_id not in calls:
        raise InvalidRequest(
            f"No tool call found for function call output with call_id {call_id}.",
            param=f"{param}.call_id",
            code="invalid_value",
        )
    if "output" not in item:
        raise MissingParameter(f"{param}.output")
    output = lower_tool_output(item["output"], f"{param}.output", low)
    messages.append(ChatMessage("tool", output, tool_call_id=call_id, name=calls[call_id].name))


_REASONING = "reasoning"  # a placeholder turn, folded by `_attach_reasoning`


def _unseal(item: dict[str, Any], param: str, kind: str, sealer: Sealer | None) -> dict[str, Any]:
    token = item.get("encrypted_content")
    if not isinstance(token, str) or not token:
        raise MissingParameter(f"{param}.encrypted_content")
    try:
        if sealer is None:
            raise Unsealable("this server has no key")
        return sealer.open(kind, token)
    except Unsealable as exc:
        raise InvalidRequest(
            f"The encrypted content of '{param}' could not be verified ({exc}): it was not "
            "issued by this server, or it was altered.",
            param=f"{param}.encrypted_content",
            code="invalid_encrypted_content",
        ) from exc


def _reasoning_text(item: dict[str, Any], param: str, sealer: Sealer | None) -> str:
    """The text of a `reasoning` item: its `reasoning_text` content, else the reasoning its
    `encrypted_content` carries, else its summary."""
    if not item.get("content") and item.get("encrypted_content") is not None:
        text = _unseal(item, param, "reasoning", sealer).get("text")
        if isinstance(text, str) and text:
            return text
    texts: list[str] = []
    for key, kinds in (("content", ("reasoning_text", "text")), ("summary", ("summary_text",))):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise InvalidRequest(
                f"Invalid type for '{param}.{key}': expected an array of content parts.",
                param=f"{param}.{key}",
                code="invalid_type",
            )
        for j, part in enumerate(parts):
            p = f"{param}.{key}[{j}]"
            if not isinstance(part, dict) or part.get("type") not in kinds:
                raise InvalidRequest(
                    f"Invalid value for '{p}.type': expected {' or '.join(map(repr, kinds))}.",
                    param=f"{p}.type",
                    code="invalid_value",
                )
            if not isinstance(part.get("text"), str):
                raise MissingParameter(f"{p}.text")
        if key == "summary" and texts:
            break  # the raw reasoning wins over its summary
        texts += [part["text"] for part in parts]
    return "\n".join(texts)


def _attach_reasoning(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Reasoning items belong to the assistant turn that follows them (its `reasoning`, the
    template's `reasoning_content`); one with no assistant turn after it before the next
    user, system or tool turn (or the end of the input) is dropped from the prompt."""
    out: list[ChatMessage] = []
    buffered: list[str] = []
    for m in messages:
        if m.role == _REASONING:
            if m.reasoning:
                buffered.append(m.reasoning)
            continue
        if m.role == "assistant" and buffered:
            m.reasoning = "\n".join([*buffered, *([m.reasoning] if m.reasoning else [])])
        buffered = []
        out.append(m)
    return out
