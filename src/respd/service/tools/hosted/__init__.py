"""Tools this server runs itself inside one response: MCP servers' tools, file search over
vector stores, web search. Each is shown to the model as a function; its calls become the
tool's own output items (`mcp_call`, `file_search_call`, `web_search_call`)."""
