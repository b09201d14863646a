"""One response's server-run tools: what the model is shown, how its calls run, and what
its answer may cite.

`HostedToolbox` is built once per server (settings, the web search backend, the vector
stores); `plan` reads a request's `mcp`, `file_search` and `web_search` tools into a
`HostedTools`. For an MCP server that means listing its tools, unless the conversation
already holds a listing of that server (an `mcp_list_tools` item), and running the calls
the client approved in this turn's input (`mcp_approval_response`) before the model goes on.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from respd.engines.base import ToolDefinition
from respd.engines.constraints import SchemaRejected
from respd.protocol.errors import APIError, InvalidRequest
from respd.service.ids import new_id
from respd.service.tools.definitions import (
    FILE_SEARCH_NAME,
    OPEN_PAGE_NAME,
    WEB_SEARCH_NAME,
    WEB_SEARCH_TOOLS,
    CallKind,
    SchemaCheck,
    ToolRoute,
    mcp_shown_name,
)
from respd.service.tools.hosted import mcp
from respd.service.tools.hosted.base import JSON, Outcome, Source
from respd.service.tools.hosted.file_search import RESULTS_INCLUDE, FileSearchTool, file_search
from respd.service.tools.hosted.settings import HostedToolSettings
from respd.service.tools.hosted.web_search import (
    SearchBackend,
    WebSearchTool,
    backend_from_setting,
    open_page,
    search,
)

if TYPE_CHECKING:
    from respd.service.vector_stores.service import VectorStores

log = logging.getLogger(__name__)
SOURCES_INCLUDE = "web_search_call.action.sources"
MAX_CITATIONS = 3
_WORD = re.compile(r"[a-z0-9]{4,}")

FILE_SEARCH = ToolDefinition(
    FILE_SEARCH_NAME,
    "Search the user's uploaded files for passages about a question. Use it before "
    "answering anything the user's documents may say.",
    {
        "type": "object",
        "properties": {
            "queries": {
                "type": "array",
                "items": {"type": "string"},
                "description": "One or more search queries.",
            }
        },
        "required": ["queries"],
    },
)
WEB_SEARCH = ToolDefinition(
    WEB_SEARCH_NAME,
    "Search the web. Use it for current events and facts you do not know.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
OPEN_PAGE = ToolDefinition(
    OPEN_PAGE_NAME,
    "Open a web page by its URL and read its text.",
    {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
)


@dataclass
class HostedTools:
    """A request's server-run tools. `listed`: the tool listings made for this response;
    `ran`: the approved calls run before its first pass; `prompt_items`: those calls and
    the declined ones, as the model reads them."""

    toolbox: HostedToolbox
    owner: str
    include: frozenset[str]
    definitions: list[ToolDefinition] = field(default_factory=list)
    routes: dict[str, ToolRoute] = field(default_factory=dict)
    listed: list[JSON] = field(default_factory=list)
    ran: list[JSON] = field(default_factory=list)
    prompt_items: list[JSON] = field(default_factory=list)
    servers: dict[str, mcp.McpServer] = field(default_factory=dict)
    web: WebSearchTool | None = None
    files: FileSearchTool | None = None
    sources: list[Source] = field(default_factory=list)  # what calls found, to cite
    question: str | None = None  # the user's last message, a file search's fallback query

    async def run(self, route: ToolRoute, arguments: str) -> Outcome:
        """Run one call; every failure becomes a failed outcome the model reads (only
        cancellation propagates)."""
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return Outcome.failure("the arguments are not a JSON object", **_empty(route))
        timeout = self.toolbox.settings.timeout_secs
        try:
            async with asyncio.timeout(timeout + 1):  # the tools keep their own limit
                outcome = await self._run(route, args, timeout)
        except TimeoutError:
            outcome = Outcome.failure(f"no answer within {timeout:g} seconds", **_empty(route))
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a tool's bug must not fail the response
            log.exception("server tool %s failed", route.kind)
            outcome = Outcome.failure(f"internal error ({type(exc).__name__})", **_empty(route))
        self.sources += outcome.sources
        self.toolbox.count(route.kind, outcome.status)
        log.info("server tool %s %s: %s", route.kind, route.name, outcome.status)
        return outcome

    async def _run(self, route: ToolRoute, args: JSON, timeout: float) -> Outcome:
        toolbox = self.toolbox
        if route.kind == "mcp":
            server = self.servers[route.namespace or ""]
            return await call_mcp(server, route.name, args, toolbox.settings)
        if route.kind == "file_search":
            assert self.files is not None
            return await file_search(
                toolbox.stores,
                self.files,
                self.owner,
                args,
                timeout=timeout,
                include_results=RESULTS_INCLUDE in self.include,
                question=self.question,
            )
        assert self.web is not None and toolbox.backend is not None
        if route.name == OPEN_PAGE_NAME:
            return await open_page(self.web, str(args.get("url") or ""), timeout)
        outcome = await search(toolbox.backend, self.web, str(args.get("query") or ""), timeout)
        if SOURCES_INCLUDE not in self.include and "action" in outcome.fields:
            outcome.fields["action"] = {**outcome.fields["action"], "sources": None}
        return outcome

    def annotate(self, text: str) -> list[JSON]:
        """The answer's citations: the sources whose words it shares most (the best-ranked
        one when it shares none), each cited once."""
        if not self.sources or not text.strip():
            return []
        words = set(_WORD.findall(text.lower()))
        scored = []
        for rank, source in enumerate(self.sources):
            shared = len(words & set(_WORD.findall(f"{source.title} {source.text}".lower())))
            scored.append((-shared, rank, source))
        scored.sort(key=lambda s: (s[0], s[1]))
        chosen = [s for shared, _, s in scored if shared < -1] or [scored[0][2]]
        seen: set[str] = set()
        out: list[JSON] = []
        for source in chosen:
            if source.ref in seen or len(out) >= MAX_CITATIONS:
                continue
            seen.add(source.ref)
            out.append(_citation(source, text))
        return out


def _citation(source: Source, text: str) -> JSON:
    if source.kind == "file":
        return {
            "type": "file_citation",
            "file_id": source.ref,
            "filename": source.title,
            "index": len(text),
        }
    return {
        "type": "url_citation",
        "url": source.ref,
        "title": source.title,
        "start_index": 0,
        "end_index": len(text),
    }


def _empty(route: ToolRoute) -> JSON:
    """The fields a failed call's item needs that it may not have yet."""
    if route.kind == "mcp":
        return {"output": None}
    return {}


async def call_mcp(
    server: mcp.McpServer, name: str, args: JSON, settings: HostedToolSettings
) -> Outcome:
    try:
        output = await mcp.call_tool(server, name, args, settings)
    except mcp.McpFailure as failure:
        return Outcome(
            "failed",
            f"The tool call failed: {failure.message}",
            {"error": failure.error, "output": None},
        )
    return Outcome("completed", output, {"output": output, "error": None})


@dataclass
class HostedToolbox:
    """What every response's server-run tools share: their settings, the web search
    backend (None: web search is off) and the vector stores."""

    settings: HostedToolSettings = field(default_factory=HostedToolSettings)
    stores: VectorStores | None = None
    backend: SearchBackend | None = None
    # calls run so far, by tool (`mcp`, `mcp_list_tools`, `file_search`, `web_search`) and
    # outcome (`completed`, `failed`), for /metrics
    calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    def tool_types(self) -> list[str]:
        """The hosted tool types this server runs (`web_search` only with a backend)."""
        return ["mcp", "file_search", *(["web_search"] if self.backend is not None else [])]

    def count(self, tool: str, outcome: str) -> None:
        self.calls[(tool, outcome)] += 1

    @classmethod
    def from_settings(
        cls, settings: HostedToolSettings, stores: VectorStores | None = None
    ) -> HostedToolbox:
        return cls(settings, stores, backend_from_setting(settings.web_search_backend))

    async def plan(
        self,
        entries: list[tuple[str, JSON]],
        *,
        owner: str,
        include: list[str],
        history: list[JSON],
        input_items: list[JSON],
        check: SchemaCheck,
        run_approved: bool = True,
        question: str | None = None,
    ) -> HostedTools | None:
        """The request's server-run tools (None: it has none this server runs).
        `run_approved` False (a token count): approved calls are shown to the model, not
        run, so counting has no side effect."""
        tools = HostedTools(self, owner, frozenset(include), question=question)
        for param, entry in entries:
            kind = entry["type"]
            if kind == "file_search":
                if tools.files is not None:
                    raise _twice("file_search", param)
                tools.files = FileSearchTool.from_tool(entry, param)
                await self._check_stores(tools.files, owner, f"{param}.vector_store_ids")
                _offer(tools, FILE_SEARCH, ToolRoute("file_search", FILE_SEARCH_NAME))
            elif kind in WEB_SEARCH_TOOLS:
                web = WebSearchTool.from_tool(entry, param)
                if self.backend is None:
                    log.warning("web_search left out of the prompt: no --web-search-backend")
                    continue
                if tools.web is not None:
                    raise _twice("web_search", param)
                tools.web = web
                _offer(tools, WEB_SEARCH, ToolRoute("web_search", WEB_SEARCH_NAME))
                _offer(tools, OPEN_PAGE, ToolRoute("web_search", OPEN_PAGE_NAME))
            else:
                server = mcp.McpServer.from_tool(entry, param)
                if server.label in tools.servers:
                    raise InvalidRequest(
                        f"Invalid '{param}.server_label': {server.label!r} names two mcp tools.",
                        param=f"{param}.server_label",
                        code="invalid_value",
                    )
                tools.servers[server.label] = server
        await self._list_servers(tools, history, check)
        await self._approved(tools, [*history, *input_items], input_items, run_approved)
        if not tools.definitions and not tools.ran and not tools.prompt_items:
            return None if not tools.listed else tools
        return tools

    async def _check_stores(self, tool: FileSearchTool, owner: str, param: str) -> None:
        """Each store the tool names is the caller's (a 404 naming it, before anything
        runs)."""
        if self.stores is None:
            raise InvalidRequest(
                "This server has no vector stores to search.", param=param, code="invalid_value"
            )
        for store_id in tool.vector_store_ids:
            try:
                await self.stores.retrieve(owner, store_id)
            except APIError as exc:
                exc.param = param
                raise

    async def _list_servers(
        self, tools: HostedTools, history: list[JSON], check: SchemaCheck
    ) -> None:
        known = {
            item.get("server_label"): item
            for item in history
            if item.get("type") == "mcp_list_tools" and not item.get("error")
        }
        for label, server in tools.servers.items():
            listing = known.get(label)
            if listing is None:
                listing = await self._listing(server)
                tools.listed.append(listing)
            for entry in listing.get("tools") or []:
                tool = mcp.McpTool(
                    str(entry.get("name")),
                    entry.get("description"),
                    entry.get("input_schema") or {"type": "object"},
                    entry.get("annotations"),
                )
                if not server.allows(tool):
                    continue
                kind: CallKind = "mcp_approval" if server.needs_approval(tool) else "mcp"
                shown = mcp_shown_name(label, tool.name)
                description = tool.description or ""
                if server.description:
                    description = f"{description} (from {server.description})".strip()
                parameters = _checked(tool.input_schema, check, shown)
                _offer(
                    tools,
                    ToolDefinition(shown, description or None, parameters),
                    ToolRoute(kind, tool.name, label),
                )

    async def _listing(self, server: mcp.McpServer) -> JSON:
        item: JSON = {"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": server.label}
        try:
            listed = await mcp.list_tools(server, self.settings)
        except mcp.McpFailure as failure:
            log.warning(
                "listing the tools of MCP server %r failed: %s", server.label, failure.message
            )
            self.count("mcp_list_tools", "failed")
            return {**item, "tools": [], "error": failure.message}
        self.count("mcp_list_tools", "completed")
        shown = [t.as_item_entry() for t in listed if server.allows(t)]
        return {**item, "tools": shown, "error": None}

    async def _approved(
        self, tools: HostedTools, items: list[JSON], input_items: list[JSON], run: bool
    ) -> None:
        """The calls this turn's `mcp_approval_response` items answer: run when approved
        (an `mcp_call` of this response), told to the model as declined otherwise."""
        requests = {i.get("id"): i for i in items if i.get("type") == "mcp_approval_request"}
        for index, item in enumerate(input_items):
            if item.get("type") != "mcp_approval_response":
                continue
            param = f"input[{index}].approval_request_id"
            request = requests.get(item.get("approval_request_id"))
            if request is None:
                raise InvalidRequest(
                    f"Invalid '{param}': no mcp_approval_request with id "
                    f"{item.get('approval_request_id')!r} in this conversation.",
                    param=param,
                    code="invalid_value",
                )
            server = tools.servers.get(str(request.get("server_label")))
            if server is None:
                raise InvalidRequest(
                    f"Invalid '{param}': the request it approves is for MCP server "
                    f"{request.get('server_label')!r}, which is not in 'tools'.",
                    param=param,
                    code="invalid_value",
                )
            call: JSON = {
                "id": new_id("mcp"),
                "type": "mcp_call",
                "server_label": server.label,
                "name": request.get("name"),
                "arguments": request.get("arguments") or "{}",
                "approval_request_id": request.get("id"),
            }
            if item.get("approve") is True and not run:
                tools.prompt_items.append({**call, "status": "in_progress", "output": None})
            elif item.get("approve") is True:
                route = ToolRoute("mcp", str(call["name"]), server.label)
                outcome = await tools.run(route, str(call["arguments"]))
                call = {**call, **outcome.fields, "status": outcome.status}
                tools.ran.append(call)
                tools.prompt_items.append(call)
            else:
                reason = item.get("reason") or "the user did not approve this call"
                error = {
                    "type": "mcp_tool_execution_error",
                    "content": [{"type": "text", "text": f"Not run: {reason}."}],
                }
                tools.prompt_items.append(
                    {**call, "status": "failed", "error": error, "output": None}
                )


def _offer(tools: HostedTools, definition: ToolDefinition, route: ToolRoute) -> None:
    tools.definitions.append(definition)
    tools.routes[definition.name] = route


def _checked(schema: JSON, check: SchemaCheck, name: str) -> JSON:
    """An MCP tool's input schema, or any object where the engine cannot enforce it."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return {"type": "object"}
    try:
        check(schema)
    except SchemaRejected as exc:
        log.warning("MCP tool %s: its input schema is not enforced (%s)", name, exc)
        return {"type": "object"}
    return schema


def _twice(kind: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid '{param}': only one '{kind}' tool may be given.",
        param=param,
        code="invalid_value",
    )
