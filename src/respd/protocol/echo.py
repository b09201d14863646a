"""What a Response repeats of its request, checked when the request is read.

A Response echoes `reasoning`, `text`, `tools`, `tool_choice` and other request settings,
and the `openai` SDK's `Response` type is strict about each of them. A value the request
body let through but the Response cannot hold would fail only once the Response is built:
after the work, or half-way through a stream. So the projection the Response will echo
(`request_echo`) is made here, once, and validated with the very field types of the SDK's
`Response` before anything runs; a bad value is a 400 naming its parameter.
"""

from __future__ import annotations

import functools
import types
import urllib.parse
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from openai.types.responses import Response
from openai.types.shared import ReasoningEffort
from pydantic import BaseModel, TypeAdapter, ValidationError

from respd.protocol.errors import InvalidRequest

# Request fields echoed as sent (None when absent).
_AS_SENT = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
)


def echo_tools(tools: list[Any] | None) -> list[Any]:
    """The tools as sent, completed where the Response's types require a field a client
    may leave out: a function's `strict` (OpenAI echoes its default, true) and a
    namespace's `description` (Codex sends namespaces without one). An `mcp` tool loses
    its `headers`, `authorization` and any credentials in its `server_url`."""
    out = []
    for tool in tools or []:
        if isinstance(tool, dict):
            if tool.get("type") == "function" and tool.get("strict") is None:
                tool = {**tool, "strict": True}
            elif tool.get("type") == "namespace" and tool.get("description") is None:
                tool = {**tool, "description": ""}
            elif tool.get("type") == "mcp":
                # an MCP server's credentials are sent to it, never echoed nor stored
                tool = {k: v for k, v in tool.items() if k != "authorization"}
                if tool.get("headers") is not None:
                    tool["headers"] = None
                if isinstance(tool.get("server_url"), str):
                    tool["server_url"] = _without_userinfo(tool["server_url"])
        out.append(tool)
    return out


def _without_userinfo(url: str) -> str:
    """`url` without the `user:password@` a client may have put in it."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def request_echo(req: Any) -> dict[str, Any]:
    """The settings a Response repeats from `req` (a create or input-token-count body):
    the fields it echoes as sent, and those it completes with their defaults."""
    out: dict[str, Any] = {name: _declared(req, name) for name in _AS_SENT}
    reasoning, text = req.reasoning, req.text
    fmt = text.format if text is not None else None
    out.update(
        background=bool(_declared(req, "background")),
        metadata=_declared(req, "metadata") or {},
        parallel_tool_calls=req.parallel_tool_calls is not False,
        reasoning={
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        store=_declared(req, "store") is not False,
        text={
            "format": (
                fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
            ),
            "verbosity": (text.verbosity if text else None) or "medium",
        },
        tool_choice=req.tool_choice or "auto",
        tools=echo_tools(req.tools),
        top_logprobs=_declared(req, "top_logprobs") or 0,
        truncation=req.truncation or "disabled",
    )
    return out


def _declared(req: BaseModel, name: str) -> Any:
    """A field `req`'s type declares; an unknown field of that name is not echoed."""
    return getattr(req, name) if name in type(req).model_fields else None


def check_response_echo(req: Any) -> None:
    """Every field `req`'s Response will echo, validated with `Response`'s own types."""
    fields = Response.model_fields
    for name, value in request_echo(req).items():
        if name in fields:  # the others (`store`) are extra fields the type keeps as sent
            check_value(fields[name].annotation, value, name)


def check_reasoning_effort(value: str | None, param: str) -> None:
    """A reasoning effort OpenAI defines (the SDK's `ReasoningEffort`)."""
    check_value(ReasoningEffort, value, param)


# -- validation that names the parameter ---------------------------------------------------


def check_value(annotation: Any, value: Any, param: str) -> None:
    """`value` validated as `annotation`, a 400 naming the offending part of `param`.

    Unions of typed objects (`tools`, `tool_choice`, `text.format`) are resolved by their
    `type` first, so an error is about the member the client meant, not a list of every
    member's complaint; inside a chosen object each field is checked the same way."""
    inner, optional = _unwrap(annotation)
    if value is None and optional:
        return
    members = _typed_members(inner)
    if members and isinstance(value, dict):
        kind = value.get("type")
        cls = members.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise _bad_type(kind, members, f"{param}.type")
        _check_model(cls, value, param)
        return
    if isinstance(inner, type) and issubclass(inner, BaseModel) and isinstance(value, dict):
        _check_model(inner, value, param)
        return
    if get_origin(inner) is list and isinstance(value, list):
        (item,) = get_args(inner) or (Any,)
        for i, entry in enumerate(value):
            check_value(item, entry, f"{param}[{i}]")
        return
    _validate(annotation, value, param)


def _check_model(cls: type[BaseModel], value: dict[str, Any], param: str) -> None:
    fields = {(f.alias or name): f for name, f in cls.model_fields.items()}
    for key, entry in value.items():
        field = fields.get(key)
        if field is not None:
            check_value(field.annotation, entry, f"{param}.{key}")
    _validate(cls, value, param)  # what no single field shows: a required one left out


def _bad_type(kind: Any, members: Mapping[str, type], param: str) -> InvalidRequest:
    shown = repr(kind) if isinstance(kind, str) else f"a value of type {type(kind).__name__}"
    if kind is None:
        shown = "nothing"
    return InvalidRequest(
        f"Invalid value for '{param}': {shown}. Supported values are: "
        f"{', '.join(repr(k) for k in sorted(members))}.",
        param=param,
        code="invalid_value",
    )


def _validate(annotation: Any, value: Any, param: str) -> None:
    try:
        _adapter(annotation).validate_python(value)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _param(param, value, err.get("loc", ()))
        if err.get("type") == "missing":
            raise InvalidRequest(
                f"Missing required parameter: '{where}'.",
                param=where,
                code="missing_required_parameter",
            ) from None
        raise InvalidRequest(
            f"Invalid value for '{where}': {err.get('msg', 'invalid value')}.",
            param=where,
            code="invalid_type" if "type" in str(err.get("type", "")) else "invalid_value",
        ) from None


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


def _param(param: str, value: Any, loc: tuple[Any, ...]) -> str:
    """`param` extended by the part of pydantic's `loc` that is a path in `value`; the
    rest names union members (`FunctionTool`, `literal[...]`), not the client's data."""
    node = value
    for key in loc:
        if isinstance(node, dict) and isinstance(key, str) and key in node:
            param, node = f"{param}.{key}", node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            param, node = f"{param}[{key}]", node[key]
        elif isinstance(node, dict) and isinstance(key, str) and _is_field_name(key):
            return f"{param}.{key}"  # a required field left out
    return param


def _is_field_name(key: str) -> bool:
    return key.isidentifier() and not key[:1].isupper()


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without `Annotated` and `Optional`, and whether None is allowed."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == len(get_args(annotation)):
            return annotation, False
        if len(args) == 1:
            return _unwrap(args[0])[0], True
        return Union[tuple(args)], True  # noqa: UP007
    return annotation, False


@functools.cache
def _typed_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """A union's object members by the `type` each declares; empty for anything else."""
    if get_origin(annotation) not in (Union, types.UnionType):
        return {}
    members: dict[str, type[BaseModel]] = {}
    for member in get_args(annotation):
        member = _unwrap(member)[0]
        if not (isinstance(member, type) and issubclass(member, BaseModel)):
            continue
        field = member.model_fields.get("type")
        if field is None or get_origin(field.annotation) is not Literal:
            continue
        for kind in get_args(field.annotation):
            members.setdefault(kind, member)
    return members
