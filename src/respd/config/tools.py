"""The flags of the tools this server runs itself (MCP, file search, web search)."""

from __future__ import annotations

import importlib.util
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from respd.config.lists import comma_separated
from respd.service.tools.hosted.settings import DEFAULT_TOOL_TIMEOUT_SECS, HostedToolSettings


class ToolsConfig(BaseModel):
    model_config = ConfigDict(title="Server-run tools")

    server_tool_timeout_secs: float = Field(
        DEFAULT_TOOL_TIMEOUT_SECS,
        gt=0,
        description="Time limit for one call of a tool the server runs (an MCP tool, a file "
        "or web search); past it the call's item is failed and the model is told.",
    )
    mcp_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts an `mcp` tool's server_url may name although they resolve to "
        "loopback, private or reserved addresses (comma-separated; '*' allows any). Others "
        "such hosts are refused.",
    )
    web_search_backend: str | None = Field(
        None,
        description="Where `web_search` tools search: 'searxng:URL' (a SearxNG instance's "
        "JSON API) or 'ddgs' (the ddgs metasearch library). Unset: web search is off and "
        "`web_search` tools are left out of the prompt.",
    )

    @field_validator("web_search_backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value == "ddgs" and importlib.util.find_spec("ddgs") is None:
            raise ValueError("'ddgs' needs the ddgs library: pip install 'respd[web]'")
        if value is None or value == "ddgs":
            return value
        kind, _, url = value.partition(":")
        if kind != "searxng" or not url.startswith(("http://", "https://")):
            raise ValueError("expected 'searxng:http(s)://HOST[:PORT][/PATH]' or 'ddgs'")
        return value

    @field_validator("mcp_allowed_hosts", mode="before")
    @classmethod
    def _comma_separated_hosts(cls, value: object) -> object:
        return comma_separated(value)

    def hosted_tools(self) -> HostedToolSettings:
        return HostedToolSettings(
            timeout_secs=self.server_tool_timeout_secs,
            mcp_allowed_hosts=frozenset(h.lower() for h in self.mcp_allowed_hosts),
            web_search_backend=self.web_search_backend,
        )
