"""Function tools and `tool_choice`, read from either API into one shape.

Responses writes a tool as `{"type":"function","name",...}` and a named choice as
`{"type":"function","name"}`; Chat Completions nests both under `"function"`. Both become
`ToolDefinition`s and a `ToolPolicy`, so everything downstream is shared. Every refusal is
a 400 naming the offending parameter. `check` is the engine's schema check: parameters it
cannot enforce are refused here, before anything is built.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from respd.engines.base import ToolDefinition
from respd.engines.constraints import SchemaRejected
from respd.protocol.errors import InvalidRequest, MissingParameter, Unsupported
from respd.protocol.schema import check_schema_document
from respd.service.tools.freeform import input_pattern

SchemaCheck = Callable[[dict[str, Any]], None]

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

Mode = Literal["auto", "none", "required"]


@dataclass(frozen=True)
class ToolPolicy:
    """What the model may do with the tools: `allowed` narrows the offered set."""

    mode: Mode = "auto"
    allowed: tuple[str, ...] | None = None
    parallel: bool = True
    max_calls: int | None = None

    def call_cap(self) -> int | None:
        cap = self.max_calls
        if not self.parallel:
            cap = 1 if cap is None else min(cap, 1)
        return cap


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _name(fields: dict[str, Any], param: str, what: str = "function") -> str:
    name = fields.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _bad(
            f"Invalid '{param}.name': a {what} name must be 1-64 characters of a-z, A-Z, "
            f"0-9, '_' or '-', got {name!r}.",
            f"{param}.name",
        )
    return name


def _function_tool(fields: dict[str, Any], param: str, check: SchemaCheck) -> ToolDefinition:
    name = _name(fields, param)
    parameters = fields.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise _bad(
                f"Invalid schema for function '{name}': the parameters must be a JSON Schema "
                "of type 'object'.",
                f"{param}.parameters",
                "invalid_function_parameters",
            )
        check_schema_document(parameters, f"{param}.parameters", "invalid_function_parameters")
        try:
            check(parameters)
        except SchemaRejected as exc:
            raise _bad(
                f"Invalid schema for function '{name}': {exc}.",
                f"{param}.parameters",
                "invalid_function_parameters",
            ) from exc
    description = fields.get("description")
    strict = fields.get("strict")
    return ToolDefinition(
        name,
        description if isinstance(description, str) else None,
        parameters,
        strict if isinstance(strict, bool) else None,
    )


def _check_unique(tools: list[ToolDefinition], param: str) -> list[ToolDefinition]:
    seen: set[str] = set()
    for i, t in enumerate(tools):
        if t.name in seen:
            raise _bad(f"Duplicate function name '{t.name}' in '{param}'.", f"{param}[{i}].name")
        seen.add(t.name)
    return tools


CallKind = Literal[
    "function",
    "custom",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
    "mcp",  # an MCP server's tool, run by this server (namespace: the server's label)
    "mcp_approval",  # the same, when the client must approve each call first
    "file_search",
    "web_search",  # name: "web_search" or "open_page", the action the model takes
]


@dataclass(frozen=True)
class ToolRoute:
    """How a call of a tool the model was shown maps back to an output item: a function
    call (of a namespace, when it is in one), a custom tool call (the `input` argument is
    its text) or a local shell call (the arguments are its action)."""

    kind: CallKind
    name: str
    namespace: str | None = None
    # a tool search's: who runs it ("server": this server; "client")
    execution: Literal["server", "client"] | None = None


@dataclass
class ResponseTools:
    """The Responses `tools`: what the model is shown, how its calls map back (by the name
    it was shown), and the hosted tools left out because this server does not run them.
    `search`: the deferred tools and the tool search over them (`tool_search.py`)."""

    tools: list[ToolDefinition]
    routes: dict[str, ToolRoute]
    omitted: list[str]
    search: Any = None
    # the entries of tools this server runs (mcp, file_search, web_search), with their
    # param, for `hosted/plan.py` to turn into functions once it knows their tools
    hosted: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def is_deferred(tool: dict[str, Any]) -> bool:
    """A function left out of the prompt until a tool search loads it."""
    return tool.get("type") == "function" and tool.get("defer_loading") is True


WEB_SEARCH_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26"}
)
# Tools this server runs itself, inside the response (`service/tools/hosted/`).
SERVER_RUN_TOOLS = WEB_SEARCH_TOOLS | {"file_search", "mcp"}
# Tools OpenAI runs on its side that this server runs too (or, like a web search with no
# search backend, leaves out of the prompt: Codex sends `web_search` on every turn).
HOSTED_TOOLS = SERVER_RUN_TOOLS | {"tool_search"}
# Hosted tools whose whole point is what they run: code, a computer, an image model. An
# answer made without them would pretend otherwise, so they are refused, naming the tool.
REFUSED_TOOLS: dict[str, str] = {
    "code_interpreter": "it runs no code for the model",
    "computer_use_preview": "it drives no computer for the model",
    "computer": "it drives no computer for the model",
    "image_generation": "it has no image generation model",
}
# The functions the server-run search tools are shown as.
FILE_SEARCH_NAME = "file_search"
WEB_SEARCH_NAME = "web_search"
OPEN_PAGE_NAME = "open_page"
LOCAL_SHELL = "local_shell"
SHELL = "shell"
APPLY_PATCH = "apply_patch"
# The client-run tools of fixed shape: each shown as a function of its own name, its call
# coming back as the tool's own item (`local_shell_call`, `shell_call`, `apply_patch_call`).
CLIENT_TOOLS: dict[str, ToolDefinition] = {
    LOCAL_SHELL: ToolDefinition(
        LOCAL_SHELL,
        "Run a command on the user's machine and get its output.",
        {
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": 'The program and its arguments, e.g. ["ls", "-la"].',
                },
                "working_directory": {"type": "string"},
                "timeout_ms": {"type": "integer"},
            },
            "required": ["command"],
        },
    ),
    SHELL: ToolDefinition(
        SHELL,
        "Run shell commands on the user's machine, one after another, and get their output.",
        {
            "type": "object",
            "properties": {
                "commands": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": 'Shell command lines, e.g. ["ls -la", "cat notes.txt"].',
                },
                "timeout_ms": {"type": "integer"},
            },
            "required": ["commands"],
        },
    ),
    APPLY_PATCH: ToolDefinition(
        APPLY_PATCH,
        "Create, update or delete one file. `diff` is the new file's lines each prefixed "
        "with '+' (create_file), or a unified diff of the change (update_file).",
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
                "path": {"type": "string"},
                "diff": {"type": "string"},
            },
            "required": ["type", "path"],
        },
    ),
}
# A shell in a container OpenAI runs is a hosted tool; one without (or `local`) is the
# client's.
_HOSTED_SHELL_ENVIRONMENTS = frozenset({"container_auto", "container_reference"})


def namespaced(namespace: str | None, name: str) -> str:
    """The name a namespace's tool is shown to the model under."""
    return f"{namespace}__{name}" if namespace else name


_NOT_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def mcp_shown_name(server_label: str, tool: str) -> str:
    """The function name an MCP server's tool is shown under: `label__tool`, in the
    characters a function name allows, at most 64 of them."""
    return _NOT_NAME.sub("_", namespaced(server_label, tool))[:64]


def _custom_tool(fields: dict[str, Any], param: str, check: SchemaCheck) -> ToolDefinition:
    """A custom tool, shown as a function of one string, `input`, held to its format."""
    name = _name(fields, param, "tool")
    text: dict[str, Any] = {"type": "string", "description": "The tool's raw input text."}
    pattern = input_pattern(fields.get("format"), f"{param}.format")
    if pattern is not None:
        text["pattern"] = pattern
    parameters = {"type": "object", "properties": {"input": text}, "required": ["input"]}
    try:
        check(parameters)
    except SchemaRejected as exc:
        raise _bad(
            f"Invalid '{param}.format': the grammar cannot be enforced: {exc}.",
            f"{param}.format",
        ) from exc
    description = fields.get("description")
    return ToolDefinition(
        name, description if isinstance(description, str) else None, parameters, True
    )


def _kind(entry: dict[str, Any], param: str) -> Any:
    """An entry's `type`, which must be a string (it is looked up in sets and maps)."""
    kind = entry.get("type")
    if kind is None:
        raise MissingParameter(f"{param}.type")
    if not isinstance(kind, str):
        raise _bad(
            f"Invalid type for '{param}.type': expected a string, got {type(kind).__name__}.",
            f"{param}.type",
            "invalid_type",
        )
    return kind


def _environment(entry: dict[str, Any]) -> Any:
    env = entry.get("environment")
    return env.get("type") if isinstance(env, dict) else None


def responses_tools(tools: list[dict[str, Any]] | None, check: SchemaCheck) -> ResponseTools:
    out: list[ToolDefinition] = []
    routes: dict[str, ToolRoute] = {}
    omitted: list[str] = []
    hosted: list[tuple[str, dict[str, Any]]] = []

    def add(entry: dict[str, Any], param: str, namespace: str | None = None) -> None:
        kind = _kind(entry, param)
        if is_deferred(entry):
            _function_tool(entry, param, check)  # checked now, shown once a search loads it
            return
        if kind == "tool_search" and namespace is None:
            return  # shown as the search function (`tool_search.py`)
        if kind in ("function", "custom"):
            make = _function_tool if kind == "function" else _custom_tool
            tool = make(entry, param, check)
            rendered = namespaced(namespace, tool.name)
            out.append(replace(tool, name=rendered))
            routes[rendered] = ToolRoute(kind, tool.name, namespace)
        elif kind == SHELL and _environment(entry) in _HOSTED_SHELL_ENVIRONMENTS:
            omitted.append(f"shell ({_environment(entry)})")
        elif kind in CLIENT_TOOLS and namespace is None:
            out.append(CLIENT_TOOLS[kind])
            routes[kind] = ToolRoute(kind, kind)
        elif kind == "namespace" and namespace is None:
            name, inner = _name(entry, param, "namespace"), entry.get("tools")
            if not isinstance(inner, list):
                raise MissingParameter(f"{param}.tools")
            for j, sub in enumerate(inner):
                if not isinstance(sub, dict):
                    raise _bad(
                        f"Invalid type for '{param}.tools[{j}]': expected an object.",
                        f"{param}.tools[{j}]",
                        "invalid_type",
                    )
                add(sub, f"{param}.tools[{j}]", name)
        elif kind in SERVER_RUN_TOOLS and namespace is None:
            hosted.append((param, entry))
        elif kind in HOSTED_TOOLS and namespace is None:
            omitted.append(str(kind))
        elif kind in REFUSED_TOOLS:
            raise Unsupported(
                f"Tools of type '{kind}' are not supported by this server: {REFUSED_TOOLS[kind]}.",
                param=f"{param}.type",
            )
        else:
            raise Unsupported(
                f"Tools of type '{kind}' are not supported by this server.",
                param=f"{param}.type",
            )

    for i, tool in enumerate(tools or []):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
        add(tool, param)
    return ResponseTools(_check_unique(out, "tools"), routes, omitted, hosted=hosted)


def chat_tools(tools: list[dict[str, Any]] | None, check: SchemaCheck) -> list[ToolDefinition]:
    out = []
    for i, tool in enumerate(tools or []):
        param = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise Unsupported(
                f"Tools of type '{kind}' are not supported by this server; only 'function' "
                "tools are.",
                param=f"{param}.type",
            )
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise MissingParameter(f"{param}.function")
        out.append(_function_tool(fn, f"{param}.function", check))
    return _check_unique(out, "tools")


def _declared(name: Any, tools: list[ToolDefinition], param: str) -> str:
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        declared = ", ".join(t.name for t in tools) or "none"
        raise _bad(
            f"Invalid '{param}': tool choice names function {name!r}, which is not in 'tools' "
            f"(declared: {declared}).",
            param,
        )
    return name


def _string_choice(choice: str, tools: list[ToolDefinition]) -> Mode:
    if choice not in ("auto", "none", "required"):
        raise _bad(
            f"Invalid value for 'tool_choice': {choice!r}. Expected 'none', 'auto', "
            "'required' or an object.",
            "tool_choice",
        )
    if choice == "required" and not tools:
        raise _bad("tool_choice 'required' needs at least one tool in 'tools'.", "tool_choice")
    return choice  # type: ignore[return-value]


def _allowed(
    mode: Any, entries: Any, tools: list[ToolDefinition], param: str, *, nested: bool
) -> ToolPolicy:
    if mode not in ("auto", "required"):
        raise _bad(
            f"Invalid value for '{param}.mode': expected 'auto' or 'required'.", f"{param}.mode"
        )
    if not isinstance(entries, list) or not entries:
        raise _bad(f"'{param}.tools' must be a non-empty array.", f"{param}.tools")
    names = []
    for j, entry in enumerate(entries):
        p = f"{param}.tools[{j}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind != "function":
            raise Unsupported(
                f"Allowed tools of type '{kind}' are not supported.", param=f"{p}.type"
            )
        fn = entry.get("function") if nested else entry
        name = fn.get("name") if isinstance(fn, dict) else None
        names.append(_declared(name, tools, f"{p}.name"))
    return ToolPolicy(mode=mode, allowed=tuple(names))


def _as_function_choice(entry: Any, param: str) -> Any:
    """A Responses choice of a custom tool, a namespace's function or the local shell, as
    the function choice of the name the model was shown; hosted tools cannot be forced."""
    if not isinstance(entry, dict):
        return entry
    kind = _kind(entry, param)
    if kind in ("function", "custom") and isinstance(entry.get("name"), str):
        return {"type": "function", "name": namespaced(entry.get("namespace"), entry["name"])}
    if kind in CLIENT_TOOLS:
        return {"type": "function", "name": kind}
    if kind == "file_search":
        return {"type": "function", "name": FILE_SEARCH_NAME}
    if kind in WEB_SEARCH_TOOLS:
        return {"type": "function", "name": WEB_SEARCH_NAME}
    if kind == "mcp" and isinstance(entry.get("name"), str):
        label = entry.get("server_label")
        return {"type": "function", "name": mcp_shown_name(str(label), entry["name"])}
    if kind in HOSTED_TOOLS or kind in REFUSED_TOOLS or str(kind).startswith("web_search"):
        raise Unsupported(
            f"A '{kind}' tool cannot be chosen: this server does not run hosted tools.",
            param=f"{param}.type",
        )
    return entry


def _mcp_server_choice(choice: dict[str, Any], tools: list[ToolDefinition]) -> ToolPolicy:
    """`{"type": "mcp", "server_label"}` with no tool named: one of that server's tools."""
    label = choice.get("server_label")
    if not isinstance(label, str):
        raise MissingParameter("tool_choice.server_label")
    prefix = mcp_shown_name(label, "")
    names = tuple(t.name for t in tools if t.name.startswith(prefix))
    if not names:
        raise _bad(
            f"Invalid 'tool_choice.server_label': no tools of MCP server {label!r} are "
            "offered in 'tools'.",
            "tool_choice.server_label",
        )
    return ToolPolicy("required", names)


def responses_tool_choice(choice: Any, tools: list[ToolDefinition]) -> ToolPolicy:
    if isinstance(choice, dict) and choice.get("type") == "mcp" and choice.get("name") is None:
        return _mcp_server_choice(choice, tools)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        entries = choice.get("tools")
        if isinstance(entries, list):
            choice = {
                **choice,
                "tools": [
                    _as_function_choice(e, f"tool_choice.tools[{j}]") for j, e in enumerate(entries)
                ],
            }
    else:
        choice = _as_function_choice(choice, "tool_choice")
    return _tool_choice(choice, tools, chat=False)


def chat_tool_choice(choice: Any, tools: list[ToolDefinition]) -> ToolPolicy:
    return _tool_choice(choice, tools, chat=True)


def _tool_choice(choice: Any, tools: list[ToolDefinition], *, chat: bool) -> ToolPolicy:
    """`tool_choice` of either API; Chat nests the function's name under `function` and
    the allowed list under `allowed_tools`."""
    if choice is None:
        return ToolPolicy()
    if isinstance(choice, str):
        return ToolPolicy(mode=_string_choice(choice, tools))
    kind = _kind(choice, "tool_choice")
    if kind == "function":
        fn = choice.get("function") if chat else choice
        name = fn.get("name") if isinstance(fn, dict) else None
        param = "tool_choice.function.name" if chat else "tool_choice.name"
        return ToolPolicy("required", (_declared(name, tools, param),))
    if kind == "allowed_tools":
        if chat:
            spec, param = choice.get("allowed_tools"), "tool_choice.allowed_tools"
        else:
            spec, param = choice, "tool_choice"
        if not isinstance(spec, dict):
            raise MissingParameter(param)
        return _allowed(spec.get("mode"), spec.get("tools"), tools, param, nested=chat)
    raise Unsupported(
        f"tool_choice of type '{kind}' is not supported; only function tools are.",
        param="tool_choice.type",
    )
