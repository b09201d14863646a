"""How the server-run tools behave: their time limit, which hosts MCP servers may be on,
and where web searches go. One place for their defaults, read by the flags."""

from __future__ import annotations

from dataclasses import dataclass, field

# Seconds one server-run tool call (an MCP call, a search) may take before it fails.
DEFAULT_TOOL_TIMEOUT_SECS = 30.0


@dataclass(frozen=True)
class HostedToolSettings:
    """`mcp_allowed_hosts`: loopback/private hosts an MCP server may be on ("*": any);
    `web_search_backend`: `searxng:URL`, `ddgs` or None (web search off)."""

    timeout_secs: float = DEFAULT_TOOL_TIMEOUT_SECS
    mcp_allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    web_search_backend: str | None = None
