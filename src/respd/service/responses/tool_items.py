"""The output items of tool calls, one shape per kind of tool.

A call is read as the JSON arguments the model wrote; the item it becomes depends on the
tool it routes to: a function call carries the arguments as they are, a custom tool call
their `input` text, and the client-run tools (local shell, shell, apply_patch) an action or
operation built from them, whole even when the model's arguments are cut short.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFileSearchToolCall,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionShellToolCall,
    ResponseFunctionToolCall,
    ResponseFunctionWebSearch,
    ResponseMcpCallArgumentsDeltaEvent,
    ResponseMcpCallArgumentsDoneEvent,
    ResponseToolSearchCall,
)
from openai.types.responses.response_output_item import (
    LocalShellCall,
    McpApprovalRequest,
    McpCall,
)
from pydantic import BaseModel

from respd.service.tools.definitions import ToolRoute
from respd.service.tools.hosted.file_search import queries_of


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_OPEN_INPUT = re.compile(r'"input"\s*:\s*"')
# Per kind of call: its item type and the prefix of its item id.
CALL_ITEM = {
    "function": ("function_call", "fc"),
    "custom": ("custom_tool_call", "ctc"),
    "local_shell": ("local_shell_call", "lsh"),
    "shell": ("shell_call", "sh"),
    "apply_patch": ("apply_patch_call", "apc"),
    "tool_search": ("tool_search_call", "tsc"),
    "mcp": ("mcp_call", "mcp"),
    "mcp_approval": ("mcp_approval_request", "mcpr"),
    "file_search": ("file_search_call", "fs"),
    "web_search": ("web_search_call", "ws"),
}
# The calls this server runs itself: their items stay open until the call has run.
SERVER_KINDS = frozenset({"mcp", "file_search", "web_search"})
_PATCH_OPERATIONS = ("create_file", "update_file", "delete_file")
# The class of each kind of call's finished item.
_ITEM_CLASSES: dict[str, type[BaseModel]] = {
    "function": ResponseFunctionToolCall,
    "custom": ResponseCustomToolCall,
    "local_shell": LocalShellCall,
    "shell": ResponseFunctionShellToolCall,
    "apply_patch": ResponseApplyPatchToolCall,
    "tool_search": ResponseToolSearchCall,
    "mcp": McpCall,
    "mcp_approval": McpApprovalRequest,
    "file_search": ResponseFileSearchToolCall,
    "web_search": ResponseFunctionWebSearch,
}


@dataclass
class OpenCall:
    """A call being written: its arguments grow by deltas; its item is made from them."""

    id: str
    call_id: str
    route: ToolRoute
    output_index: int
    arguments: str = ""  # the JSON the model wrote, as it arrives

    def input_text(self) -> str:
        """A custom tool call's text: its `input` argument (as far as it was written, for
        a call cut short)."""
        value = _json_object(self.arguments).get("input")
        if isinstance(value, str):
            return value
        m = _OPEN_INPUT.search(self.arguments)
        if m is None:
            return ""
        text = self.arguments[m.end() :]
        for cut in range(len(text), max(len(text) - 6, -1), -1):  # a cut escape sequence
            try:
                partial = json.loads('"' + text[:cut] + '"')
            except ValueError:
                continue
            return partial if isinstance(partial, str) else ""
        return ""

    def patch_operation(self) -> dict[str, Any]:
        """An apply_patch call's `operation`, whole even when the model's arguments are not
        (a cut call, an unknown operation type): the client reads its path and diff."""
        args = _json_object(self.arguments)
        kind = args.get("type")
        op: dict[str, Any] = {
            "type": kind if kind in _PATCH_OPERATIONS else "update_file",
            "path": str(args.get("path") or ""),
        }
        if op["type"] != "delete_file":
            op["diff"] = str(args.get("diff") or "")
        return {"operation": op}

    def item(self, status: str) -> dict[str, Any]:
        route = self.route
        if route.kind == "apply_patch" and status != "completed":
            status = "in_progress"  # the item type knows no other unfinished state
        head = {"id": self.id, "type": CALL_ITEM[route.kind][0], "status": status}
        if route.kind in SERVER_KINDS or route.kind == "mcp_approval":
            return self._hosted_item(head)
        if route.kind == "tool_search":
            # a hosted search has no call id: its output follows it in the same response
            execution = route.execution or "server"
            call_id = self.call_id if execution == "client" else None
            args = _json_object(self.arguments)
            return {**head, "call_id": call_id, "execution": execution, "arguments": args}
        if route.kind == "local_shell":
            args = _json_object(self.arguments)
            command = args.get("command")
            action: dict[str, Any] = {
                "type": "exec",
                "command": [str(c) for c in command] if isinstance(command, list) else [],
                "env": {},
            }
            for key in ("working_directory", "timeout_ms"):
                if args.get(key) is not None:
                    action[key] = args[key]
            return {**head, "call_id": self.call_id, "action": action}
        if route.kind == "shell":
            args = _json_object(self.arguments)
            commands = args.get("commands")
            timeout = args.get("timeout_ms")
            action = {
                "commands": [str(c) for c in commands] if isinstance(commands, list) else [],
                "timeout_ms": timeout if isinstance(timeout, int) else None,
                "max_output_length": None,
            }
            return {**head, "call_id": self.call_id, "action": action}
        if route.kind == "apply_patch":
            return {**head, "call_id": self.call_id, **self.patch_operation()}
        if route.kind == "custom":
            head["input"] = self.input_text()
        else:
            head["arguments"] = self.arguments
        head.update(call_id=self.call_id, name=route.name)
        if route.namespace:
            head["namespace"] = route.namespace
        return head

    def _hosted_item(self, head: dict[str, Any]) -> dict[str, Any]:
        """A call of a tool this server runs: its item as it stands before it has run."""
        route, args = self.route, _json_object(self.arguments)
        if route.kind in ("mcp", "mcp_approval"):
            if route.kind == "mcp_approval":
                del head["status"]  # a request to approve has no status
            names = {"server_label": route.namespace or "", "name": route.name}
            return {**head, **names, "arguments": self.arguments}
        if route.kind == "file_search":
            return {**head, "queries": queries_of(args), "results": None}
        if route.name == "open_page":
            url = args.get("url")
            return {
                **head,
                "action": {"type": "open_page", "url": url if isinstance(url, str) else ""},
            }
        query = args.get("query")
        query = query if isinstance(query, str) else ""
        return {**head, "action": {"type": "search", "query": query, "queries": [query]}}

    def delta_event(self, delta: str) -> tuple[type[BaseModel], dict[str, Any]] | None:
        """The event that streams `delta` of the arguments, for the calls that stream them
        (a function's, an MCP tool's)."""
        kinds: dict[str, tuple[type[BaseModel], str]] = {
            "function": (ResponseFunctionCallArgumentsDeltaEvent, "function_call_arguments"),
            "mcp": (ResponseMcpCallArgumentsDeltaEvent, "mcp_call_arguments"),
        }
        if self.route.kind not in kinds:
            return None
        cls, name = kinds[self.route.kind]
        where = {"item_id": self.id, "output_index": self.output_index}
        return cls, {"type": f"response.{name}.delta", **where, "delta": delta}

    def closing_events(self) -> list[tuple[type[BaseModel], dict[str, Any]]]:
        """The events that end the call ahead of its `output_item.done`, as (class, fields)
        for the machine to number: a function call's arguments, a custom tool call's input
        (the client-run tools' calls have none)."""
        where = {"item_id": self.id, "output_index": self.output_index}
        if self.route.kind == "function":
            done = {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": self.arguments,
                "name": self.route.name,  # required by older SDKs (3.3.x), harmless for newer
            }
            return [(ResponseFunctionCallArgumentsDoneEvent, done)]
        if self.route.kind == "mcp":
            done = {
                "type": "response.mcp_call_arguments.done",
                **where,
                "arguments": self.arguments,
            }
            return [(ResponseMcpCallArgumentsDoneEvent, done)]
        if self.route.kind != "custom":
            return []
        text = self.input_text()
        events: list[tuple[type[BaseModel], dict[str, Any]]] = []
        if text:
            delta = {"type": "response.custom_tool_call_input.delta", **where, "delta": text}
            events.append((ResponseCustomToolCallInputDeltaEvent, delta))
        done = {"type": "response.custom_tool_call_input.done", **where, "input": text}
        return [*events, (ResponseCustomToolCallInputDoneEvent, done)]

    def done_item(self, item: dict[str, Any]) -> BaseModel:
        """`item` (this call's finished item) as its SDK class."""
        return _ITEM_CLASSES[self.route.kind].model_validate(item)
