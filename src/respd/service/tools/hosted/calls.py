"""A server-run call's item, read back as the function call the model made and the result
it read: for a later pass of the same response, and for later turns of the conversation."""

from __future__ import annotations

import json
from typing import Any

from respd.engines.base import ToolCall
from respd.service.tools.definitions import (
    FILE_SEARCH_NAME,
    OPEN_PAGE_NAME,
    WEB_SEARCH_NAME,
    mcp_shown_name,
)

JSON = dict[str, Any]


def server_call(item: JSON, result: str | None = None) -> tuple[ToolCall, str]:
    """The call an `mcp_call`, `file_search_call` or `web_search_call` item records, and
    the text its result was (`result` when known, else what the item keeps)."""
    call_id = str(item.get("id") or "call")
    kind = item.get("type")
    if kind == "mcp_call":
        name = mcp_shown_name(str(item.get("server_label")), str(item.get("name")))
        call = ToolCall(call_id, name, str(item.get("arguments") or "{}"))
        return call, result if result is not None else _mcp_result(item)
    if kind == "file_search_call":
        queries = item.get("queries") or []
        call = ToolCall(call_id, FILE_SEARCH_NAME, json.dumps({"queries": queries}))
        return call, result if result is not None else _file_results(item)
    found = item.get("action")
    action: JSON = found if isinstance(found, dict) else {}
    if action.get("type") == "open_page":
        call = ToolCall(call_id, OPEN_PAGE_NAME, json.dumps({"url": action.get("url") or ""}))
    else:
        call = ToolCall(call_id, WEB_SEARCH_NAME, json.dumps({"query": action.get("query") or ""}))
    return call, result if result is not None else _web_results(item, action)


def _mcp_result(item: JSON) -> str:
    if item.get("output") is not None:
        return str(item["output"])
    error = item.get("error")
    if isinstance(error, dict):
        detail = error.get("message") or json.dumps(error.get("content"))
        return f"The tool call failed: {detail}"
    return "The tool call did not finish."


def _file_results(item: JSON) -> str:
    results = item.get("results")
    if not results:
        return "Search results were not kept."
    return "\n\n".join(
        f"[{i}] {r.get('filename')}\n{r.get('text')}" for i, r in enumerate(results, 1)
    )


def _web_results(item: JSON, action: JSON) -> str:
    sources = action.get("sources") or []
    urls = [str(s.get("url")) for s in sources if isinstance(s, dict)]
    if item.get("status") == "failed":
        return "The web search failed."
    return "Pages found: " + ", ".join(urls) if urls else "Search results were not kept."
