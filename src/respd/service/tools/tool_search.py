"""Tool search: deferred tools stay out of the prompt until the model searches for them.

A request marks functions (top-level, or inside a namespace) `defer_loading: true` and adds
a `tool_search` tool. The model is shown the tools that are not deferred, plus one function,
`tool_search`, whose description names what can be searched. When the model calls it:

- `execution: "server"` (the default, hosted): this server runs the search over the
  deferred tools' names and descriptions (`search`) and the tools found join the prompt on
  the next pass of the same response;
- `execution: "client"`: the call comes back as a `tool_search_call` item for the client to
  answer with a `tool_search_output` item in its next request.

Either way, the tools a `tool_search_output` item lists (in the history or the input) are
offered to the model from then on (`loaded_tools`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from respd.engines.base import ToolDefinition
from respd.protocol.errors import InvalidRequest
from respd.service.tools.definitions import (
    ResponseTools,
    SchemaCheck,
    ToolRoute,
    is_deferred,
    responses_tools,
)

SEARCH_NAME = "tool_search"
Execution = Literal["server", "client"]
# Tools one hosted search loads when it matches by query.
MAX_FOUND = 5
# Hosted searches one response may run; past it the model is no longer offered the search.
MAX_SEARCHES = 3
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "get", "how", "i", "in"}
    | {"is", "it", "me", "my", "of", "on", "or", "the", "to", "tool", "tools", "use", "what"}
    | {"with"}
)
# What a client-executed search takes when the client gives no schema of its own.
CLIENT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "paths": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Names of the tools or namespaces to load.",
        }
    },
    "required": ["paths"],
}
HOSTED_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "Words describing the tool you need."},
        "paths": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Exact names of tools or namespaces to load, if you know them.",
        },
    },
    "required": ["query"],
}


@dataclass(frozen=True)
class Deferred:
    """One deferred function: its definition as the client sent it, and the namespace
    (name, description) it belongs to."""

    tool: dict[str, Any]
    namespace: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return str(self.tool.get("name", ""))

    @property
    def shown_name(self) -> str:
        """The name the model calls it by once loaded."""
        return f"{self.namespace[0]}__{self.name}" if self.namespace else self.name

    def words(self) -> tuple[set[str], set[str]]:
        """Its name's words, and those of its descriptions (its namespace's included)."""
        about = [str(self.tool.get("description") or "")]
        names = [self.name]
        if self.namespace:
            names.append(self.namespace[0])
            about.append(self.namespace[1])
        return _words(" ".join(names)), _words(" ".join(about))


@dataclass
class SearchPlan:
    """The request's deferred tools and its `tool_search` tool (`execution` None: the
    request has none). `responses_tools` leaves both out of what the model is shown."""

    deferred: list[Deferred] = field(default_factory=list)
    execution: Execution | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None

    @property
    def hosted(self) -> bool:
        return self.execution == "server"

    def definition(self) -> ToolDefinition | None:
        """The search as the function the model is shown (None: nothing to search)."""
        if self.execution is None or (self.hosted and not self.deferred):
            return None
        if self.hosted:
            return ToolDefinition(SEARCH_NAME, self._hosted_description(), HOSTED_PARAMETERS)
        description = self.description or (
            "Load more tools: name the tools or namespaces you need and they become "
            "available to call."
        )
        return ToolDefinition(SEARCH_NAME, description, self.parameters or CLIENT_PARAMETERS)

    def _hosted_description(self) -> str:
        """What the model is told it can search: each namespace once, each top-level
        deferred function, with their descriptions."""
        seen: dict[str, str] = {}
        for d in self.deferred:
            name, about = d.namespace or (d.name, str(d.tool.get("description") or ""))
            seen.setdefault(name, about)
        listed = "; ".join(f"{n}: {a}" if a else n for n, a in seen.items())
        return (
            "Search for tools and load the ones that match, so that you can call them. "
            f"Searchable: {listed}."
        )


def _words(text: str) -> set[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower()
    return {w for w in _WORD.findall(spaced.replace("_", " ")) if w not in _STOPWORDS}


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def _deferred(tool: dict[str, Any]) -> bool:
    return is_deferred(tool)


def _search_tool(plan: SearchPlan, tool: dict[str, Any], param: str) -> None:
    if plan.execution is not None:
        raise _bad("Only one 'tool_search' tool may be given.", param)
    execution = tool.get("execution") or "server"
    if execution != "server" and execution != "client":
        raise _bad(
            f"Invalid value for '{param}.execution': expected 'server' or 'client', got "
            f"{execution!r}.",
            f"{param}.execution",
        )
    parameters = tool.get("parameters")
    if parameters is not None and (
        not isinstance(parameters, dict) or parameters.get("type", "object") != "object"
    ):
        raise _bad(
            f"Invalid '{param}.parameters': expected a JSON Schema of type 'object'.",
            f"{param}.parameters",
        )
    description = tool.get("description")
    plan.execution = "server" if execution == "server" else "client"
    plan.description = description if isinstance(description, str) else None
    plan.parameters = parameters


def plan_search(tools: list[dict[str, Any]] | None) -> SearchPlan:
    """Split the request's tools; deferred tools without a `tool_search` tool are a 400
    (nothing could ever load them)."""
    plan = SearchPlan()
    first_deferred: str | None = None
    for i, tool in enumerate(tools or []):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            continue  # refused with its path by `responses_tools`
        if tool.get("type") == SEARCH_NAME:
            _search_tool(plan, tool, param)
        elif _deferred(tool):
            plan.deferred.append(Deferred(tool))
            first_deferred = first_deferred or f"{param}.defer_loading"
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            about = (str(tool.get("name", "")), str(tool.get("description") or ""))
            for j, sub in enumerate(tool["tools"]):
                if isinstance(sub, dict) and _deferred(sub):
                    plan.deferred.append(Deferred(sub, about))
                    first_deferred = first_deferred or f"{param}.tools[{j}].defer_loading"
    if first_deferred is not None and plan.execution is None:
        raise _bad(
            "Tools with 'defer_loading': true need a 'tool_search' tool in 'tools' to load them.",
            first_deferred,
        )
    return plan


def _by_path(path: str, deferred: list[Deferred]) -> list[Deferred]:
    """A path names a namespace (all its deferred tools), one of its tools (`ns.fn`,
    `ns/fn` or `ns__fn`) or a top-level function."""
    path = path.strip()
    found = [d for d in deferred if d.namespace and d.namespace[0] == path]
    found += [d for d in deferred if path in (d.shown_name, d.name) and d not in found]
    for sep in (".", "/"):
        if sep in path:
            ns, _, name = path.partition(sep)
            found += [
                d for d in deferred if d.namespace and d.namespace[0] == ns and d.name == name
            ]
    return found


def _by_query(query: str, deferred: list[Deferred]) -> list[Deferred]:
    """The deferred tools whose words the query shares, best first: a word of the name
    counts twice, one of a description once."""
    wanted = _words(query)
    scored: list[tuple[int, int, Deferred]] = []
    for i, d in enumerate(deferred):
        names, about = d.words()
        score = 2 * len(wanted & names) + len(wanted & about)
        if score:
            scored.append((-score, i, d))
    return [d for _, _, d in sorted(scored, key=lambda s: s[:2])][:MAX_FOUND]


def search(arguments: dict[str, Any], deferred: list[Deferred]) -> list[dict[str, Any]]:
    """A hosted search: the tools `paths` name, else those matching `query`, as the
    `tools` of a `tool_search_output` item (a namespace's tools inside their namespace)."""
    found: list[Deferred] = []
    paths = arguments.get("paths")
    if isinstance(paths, list):
        for path in paths:
            if isinstance(path, str):
                found += [d for d in _by_path(path, deferred) if d not in found]
    query = arguments.get("query")
    if not found and isinstance(query, str):
        found = _by_query(query, deferred)
    return as_output_tools(found)


def as_output_tools(found: Iterable[Deferred]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    spaces: dict[str, dict[str, Any]] = {}
    for d in found:
        if d.namespace is None:
            out.append(d.tool)
            continue
        name, about = d.namespace
        if name not in spaces:
            spaces[name] = {"type": "namespace", "name": name, "description": about, "tools": []}
            out.append(spaces[name])
        spaces[name]["tools"].append(d.tool)
    return out


def loaded_tools(*item_lists: Any) -> list[dict[str, Any]]:
    """The tools every `tool_search_output` item in these item lists loaded, in order; a
    later definition of a name replaces an earlier one."""
    by_name: dict[str, dict[str, Any]] = {}
    for items in item_lists:
        if not isinstance(items, list):
            continue
        for item in items:
            if not (isinstance(item, dict) and item.get("type") == "tool_search_output"):
                continue
            for tool in item.get("tools") or []:
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    _merge(by_name, tool)
    return list(by_name.values())


def _merge(by_name: dict[str, dict[str, Any]], tool: dict[str, Any]) -> None:
    """A namespace loaded twice holds the tools of both loads."""
    name = tool["name"]
    old = by_name.get(name)
    if tool.get("type") == "namespace" and old is not None and old.get("type") == "namespace":
        inner = {t.get("name"): t for t in [*old.get("tools", []), *tool.get("tools", [])]}
        tool = {**tool, "tools": list(inner.values())}
    by_name[name] = tool


def undeferred(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Loaded tools as the model is shown them: `defer_loading` no longer holds them back."""
    out = []
    for tool in tools:
        tool = {k: v for k, v in tool.items() if k != "defer_loading"}
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            tool["tools"] = undeferred([t for t in tool["tools"] if isinstance(t, dict)])
        out.append(tool)
    return out


def shown_names(tools: list[dict[str, Any]]) -> list[str]:
    """The names the model calls these tools by (a namespace's, prefixed)."""
    names: list[str] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            names += [f"{tool['name']}__{t.get('name')}" for t in tool.get("tools") or []]
        else:
            names.append(str(tool.get("name")))
    return names


def output_text(tools: list[dict[str, Any]]) -> str:
    """What the model reads as the search's result."""
    names = shown_names(tools)
    if not names:
        return "No tools matched the search."
    return "These tools are now available to call: " + ", ".join(names) + "."


def offered_tools(tools: list[dict[str, Any]] | None, check: SchemaCheck) -> ResponseTools:
    """The Responses `tools` as the model is shown them, tool search included: the tools
    not deferred, then the search function (routed to `tool_search_call` items)."""
    plan = plan_search(tools)
    offered = responses_tools(tools, check)
    offered.search = plan
    definition = plan.definition()
    if definition is not None:
        if SEARCH_NAME in offered.routes:
            raise _bad(
                f"A tool named '{SEARCH_NAME}' cannot be given beside a 'tool_search' tool.",
                "tools",
            )
        offered.tools.append(definition)
        offered.routes[SEARCH_NAME] = ToolRoute(
            "tool_search", SEARCH_NAME, execution=plan.execution
        )
    return offered


def load_found(offered: ResponseTools, items: list[Any], check: SchemaCheck) -> None:
    """Offer the tools earlier searches loaded (`tool_search_output` items in `items`),
    after the request's own; a name the request already offers keeps its definition."""
    found = [t for t in loaded_tools(*items) if t["name"] not in offered.routes]
    if not found:
        return
    extra = responses_tools(undeferred(found), check)
    names = {t.name for t in offered.tools}
    for tool in extra.tools:
        if tool.name not in names:
            offered.tools.append(tool)
            offered.routes[tool.name] = extra.routes[tool.name]
