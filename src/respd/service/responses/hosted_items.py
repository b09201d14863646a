"""The items of calls this server runs itself, and the events that tell their progress.

A server-run call's item is announced while the model writes it (`tool_items.py`), stays
open while the call runs, and is finished with what the run gave: an `mcp_call` its output
or error, a `file_search_call` its queries and results, a `web_search_call` its action's
sources. The progress events come in the order OpenAI sends them: `in_progress`, then
`searching` for searches, then `completed` or `failed`.
"""

from __future__ import annotations

from typing import Any

from openai.types.responses import (
    ResponseFileSearchCallCompletedEvent,
    ResponseFileSearchCallInProgressEvent,
    ResponseFileSearchCallSearchingEvent,
    ResponseMcpCallCompletedEvent,
    ResponseMcpCallFailedEvent,
    ResponseMcpCallInProgressEvent,
    ResponseMcpListToolsCompletedEvent,
    ResponseMcpListToolsFailedEvent,
    ResponseMcpListToolsInProgressEvent,
    ResponseWebSearchCallCompletedEvent,
    ResponseWebSearchCallInProgressEvent,
    ResponseWebSearchCallSearchingEvent,
)
from pydantic import BaseModel

from respd.service.tools.hosted.base import Outcome

Event = tuple[type[BaseModel], dict[str, Any]]
# Per item type: the events that say it started, completed and failed (a type with no
# failed event tells it by the item's `failed` status alone).
_STARTED: dict[str, list[tuple[type[BaseModel], str]]] = {
    "mcp_call": [(ResponseMcpCallInProgressEvent, "response.mcp_call.in_progress")],
    "mcp_list_tools": [
        (ResponseMcpListToolsInProgressEvent, "response.mcp_list_tools.in_progress")
    ],
    "file_search_call": [
        (ResponseFileSearchCallInProgressEvent, "response.file_search_call.in_progress"),
        (ResponseFileSearchCallSearchingEvent, "response.file_search_call.searching"),
    ],
    "web_search_call": [
        (ResponseWebSearchCallInProgressEvent, "response.web_search_call.in_progress"),
        (ResponseWebSearchCallSearchingEvent, "response.web_search_call.searching"),
    ],
}
_COMPLETED: dict[str, tuple[type[BaseModel], str]] = {
    "mcp_call": (ResponseMcpCallCompletedEvent, "response.mcp_call.completed"),
    "mcp_list_tools": (ResponseMcpListToolsCompletedEvent, "response.mcp_list_tools.completed"),
    "file_search_call": (
        ResponseFileSearchCallCompletedEvent,
        "response.file_search_call.completed",
    ),
    "web_search_call": (ResponseWebSearchCallCompletedEvent, "response.web_search_call.completed"),
}
_FAILED: dict[str, tuple[type[BaseModel], str]] = {
    "mcp_call": (ResponseMcpCallFailedEvent, "response.mcp_call.failed"),
    "mcp_list_tools": (ResponseMcpListToolsFailedEvent, "response.mcp_list_tools.failed"),
}


def started_events(item: dict[str, Any], where: dict[str, Any]) -> list[Event]:
    return [(cls, {"type": name, **where}) for cls, name in _STARTED[item["type"]]]


def ended_events(item: dict[str, Any], where: dict[str, Any]) -> list[Event]:
    """`completed`, or `failed` where the item type has such an event."""
    failed = item.get("status") == "failed" or bool(item.get("error"))
    table = _FAILED if failed else _COMPLETED
    found = table.get(item["type"])
    return [] if found is None else [(found[0], {"type": found[1], **where})]


def finished_item(item: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """`item` once its call ran: its status, and the fields the outcome gives it."""
    done = {**item, **outcome.fields, "status": outcome.status}
    if item["type"] == "web_search_call" and "action" in outcome.fields:
        # the model's own query stays; the run adds the sources it found
        done["action"] = {**item.get("action", {}), **outcome.fields["action"]}
    return done


def announced(item: dict[str, Any]) -> dict[str, Any]:
    """An item run before the response began, as its `output_item.added` shows it: still
    running (a listing with no tools yet)."""
    if item["type"] == "mcp_list_tools":
        return {**item, "tools": [], "error": None}
    return {**item, "status": "in_progress"} if "status" in item else item
