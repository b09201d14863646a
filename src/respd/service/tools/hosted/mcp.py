"""The client side of the `mcp` tool: list a remote MCP server's tools and call one, with the
official `mcp` SDK.

Each list or call is one short session (connect, negotiate, act, close) over streamable HTTP,
or over SSE when the URL's path ends with `/sse`. Before connecting, the URL's host is resolved
and refused when it is loopback, private, link-local or reserved (unless `--mcp-allowed-hosts`
names it), and connections are pinned to the addresses that were checked, so neither DNS nor a
redirect can swap in another host. The request's `headers` and `authorization` go with every
HTTP request and never into logs, messages or reprs.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import httpcore2
import httpx2

from respd.protocol.errors import InvalidRequest, MissingParameter, Unsupported
from respd.service.media.fetch import address_refused, literal_address
from respd.service.tools.hosted.settings import HostedToolSettings

if TYPE_CHECKING:  # the SDK takes about a second to import: loaded on the first MCP use
    from mcp.client import Client
    from mcp_types import ContentBlock, Tool

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_LABEL = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# An HTTP header name (RFC 9110 token) and a value that cannot split the header block.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[^\r\n\x00]*")
# A server that pages its tool list forever cannot hold a response: this many pages at most.
_MAX_PAGES = 50
# JSON-RPC's "internal error", for a failure the server's reply did not name.
_INTERNAL_ERROR = -32603
# The SDK logs a failed request with a traceback, which our one-line log already reports.
_SDK_LOGGERS = (
    "mcp.client.streamable_http",
    "mcp.client.sse",
    "mcp.client.session",
    "mcp.shared.jsonrpc_dispatcher",
)


class McpFailure(Exception):
    """A failed list or call, as the item's `error` object."""

    def __init__(self, error: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _http_failure(code: int, message: str) -> McpFailure:
    return McpFailure({"type": "http_error", "code": code, "message": message}, message)


@dataclass(frozen=True)
class McpTool:
    """One tool a server listed."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None

    @property
    def read_only(self) -> bool:
        return bool(self.annotations and self.annotations.get("readOnlyHint") is True)

    def as_item_entry(self) -> dict[str, Any]:
        """The tool as an entry of an `mcp_list_tools` item's `tools`."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
        }


def _matches(criteria: dict[str, Any] | None, tool: McpTool, *, empty: bool) -> bool:
    """Whether `tool` passes a `{"tool_names", "read_only"}` filter (both, when both are
    given); `empty` is the answer for a filter that names no criterion."""
    if not criteria:
        return empty
    names = criteria.get("tool_names")
    read_only = criteria.get("read_only")
    if names is None and read_only is None:
        return empty
    return (names is None or tool.name in names) and (
        read_only is None or tool.read_only == read_only
    )


@dataclass(frozen=True)
class McpServer:
    """One `mcp` entry of a request's `tools`, validated."""

    label: str
    url: str = field(repr=False)  # may carry credentials (`user:pass@`)
    headers: dict[str, str] = field(repr=False)
    authorization: str | None = field(repr=False)
    allowed_tools: Any  # None | list[str] | {"tool_names": [...], "read_only": bool}
    require_approval: Any  # "always" | "never" | {"always": {...}, "never": {...}} | None
    description: str | None

    @classmethod
    def from_tool(cls, entry: dict[str, Any], param: str) -> McpServer:
        """Validate one `tools[i]` entry of type `mcp`; errors name `param.field`."""
        for unsupported in ("connector_id", "tunnel_id"):
            if entry.get(unsupported) is not None:
                raise Unsupported(
                    f"'{param}.{unsupported}' is not supported: this server connects to MCP "
                    "servers by 'server_url' only.",
                    param=f"{param}.{unsupported}",
                )
        label = entry.get("server_label")
        if label is None:
            raise MissingParameter(f"{param}.server_label")
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise _invalid(
                f"Invalid '{param}.server_label': expected 1-64 characters of a-z, A-Z, 0-9, "
                "'_' or '-'.",
                f"{param}.server_label",
            )
        url = entry.get("server_url")
        if url is None:
            raise MissingParameter(f"{param}.server_url")
        if not isinstance(url, str) or not _http_url(url):
            raise _invalid(
                f"Invalid '{param}.server_url': expected an http or https URL.",
                f"{param}.server_url",
            )
        return cls(
            label=label,
            url=url,
            headers=_headers(entry.get("headers"), f"{param}.headers"),
            authorization=_authorization(entry.get("authorization"), f"{param}.authorization"),
            allowed_tools=_allowed_tools(entry.get("allowed_tools"), f"{param}.allowed_tools"),
            require_approval=_require_approval(
                entry.get("require_approval"), f"{param}.require_approval"
            ),
            description=_optional_text(
                entry.get("server_description"), f"{param}.server_description"
            ),
        )

    def allows(self, tool: McpTool) -> bool:
        """Whether `allowed_tools` lets the model see `tool`."""
        if self.allowed_tools is None:
            return True
        if isinstance(self.allowed_tools, list):
            return tool.name in self.allowed_tools
        return _matches(self.allowed_tools, tool, empty=True)

    def needs_approval(self, tool: McpTool) -> bool:
        """Whether a call of `tool` waits for an `mcp_approval_response`: as OpenAI, a tool
        neither filter names needs one, and one both name does too."""
        policy = self.require_approval
        if policy is None or policy == "always":
            return True
        if policy == "never":
            return False
        if _matches(policy.get("always"), tool, empty=False):
            return True
        return not _matches(policy.get("never"), tool, empty=False)

    @property
    def sse(self) -> bool:
        return urllib.parse.urlsplit(self.url).path.rstrip("/").endswith("/sse")

    def request_headers(self) -> dict[str, str]:
        """What goes with every HTTP request: `headers`, then the bearer token."""
        headers = dict(self.headers)
        if self.authorization is not None:
            for name in [name for name in headers if name.lower() == "authorization"]:
                del headers[name]
            headers["Authorization"] = f"Bearer {self.authorization}"
        return headers


def _invalid(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _http_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        httpx2.URL(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except (ValueError, httpx2.InvalidURL):
        return False


def _optional_text(value: Any, param: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _invalid(f"Invalid type for '{param}': expected a string.", param, "invalid_type")
    return value


def _headers(value: Any, param: str) -> dict[str, str]:
    """The `headers` object; messages name a bad header, never its value."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    for name, text in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise _invalid(f"Invalid '{param}': a header name is not a valid HTTP token.", param)
        if not isinstance(text, str) or not _HEADER_VALUE.fullmatch(text):
            raise _invalid(
                f"Invalid '{param}.{name}': expected a string without line breaks.",
                f"{param}.{name}",
            )
    return dict(value)


def _authorization(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or not _HEADER_VALUE.fullmatch(value):
        raise _invalid(
            f"Invalid '{param}': expected a non-empty string without line breaks.", param
        )
    return value


def _names(value: Any, param: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _invalid(
            f"Invalid type for '{param}': expected an array of strings.", param, "invalid_type"
        )
    return list(value)


def _filter(value: Any, param: str) -> dict[str, Any] | None:
    """A `{"tool_names": [...], "read_only": bool}` filter, both optional."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(f"Invalid type for '{param}': expected an object.", param, "invalid_type")
    for key in value:
        if key not in ("tool_names", "read_only"):
            raise Unsupported(f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}")
    read_only = value.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise _invalid(
            f"Invalid type for '{param}.read_only': expected a boolean.",
            f"{param}.read_only",
            "invalid_type",
        )
    return {
        "tool_names": _names(value.get("tool_names"), f"{param}.tool_names"),
        "read_only": read_only,
    }


def _allowed_tools(value: Any, param: str) -> Any:
    if isinstance(value, list):
        return _names(value, param)
    return _filter(value, param)


def _require_approval(value: Any, param: str) -> Any:
    if value is None or value in ("always", "never"):
        return value
    if not isinstance(value, dict):
        raise _invalid(
            f"Invalid value for '{param}': expected 'always', 'never' or an object.", param
        )
    for key in value:
        if key not in ("always", "never"):
            raise Unsupported(f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}")
    return {key: _filter(value.get(key), f"{param}.{key}") for key in ("always", "never")}


def _as_tool(tool: Tool) -> McpTool:
    annotations = tool.annotations
    return McpTool(
        name=tool.name,
        description=tool.description,
        input_schema=dict(tool.input_schema),
        annotations=(
            annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
            if annotations is not None
            else None
        ),
    )


async def list_tools(server: McpServer, settings: HostedToolSettings) -> list[McpTool]:
    """The server's tools, every page of them, within `settings.timeout_secs`."""

    async def act(client: Client) -> list[McpTool]:
        tools: list[McpTool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(_as_tool(tool) for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    return await _session(server, settings, "listing tools", act)


async def call_tool(
    server: McpServer, name: str, arguments: dict[str, Any], settings: HostedToolSettings
) -> str:
    """Call tool `name`; its output as text (text contents joined, structured content as
    JSON when there is no text). A result flagged as an error raises `McpFailure` with its
    content."""

    async def act(client: Client) -> str:
        result = await client.call_tool(name, arguments)
        content = [_dump(block) for block in result.content]
        text = "\n".join(_text(block) for block in result.content)
        if result.is_error:
            raise McpFailure(
                {"type": "mcp_tool_execution_error", "content": content},
                f"the tool '{name}' failed: {_one_line(text) or 'no details'}",
            )
        if not text and result.structured_content is not None:
            return json.dumps(result.structured_content, ensure_ascii=False)
        return text

    return await _session(server, settings, f"calling '{name}'", act)


def _dump(block: ContentBlock) -> dict[str, Any]:
    return block.model_dump(mode="json", by_alias=True, exclude_none=True)


def _text(block: ContentBlock) -> str:
    """A content block as text: its text, an embedded text resource's text, else its JSON."""
    if block.type == "text":
        return block.text
    if block.type == "resource" and hasattr(block.resource, "text"):
        return str(block.resource.text)
    return json.dumps(_dump(block), ensure_ascii=False)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def _session(
    server: McpServer,
    settings: HostedToolSettings,
    what: str,
    act: Callable[[Client], Awaitable[_T]],
) -> _T:
    """Run `act` in one fresh session within the time limit, every failure an `McpFailure`
    logged on one line. Cancellation of the awaiting task passes through untouched."""
    seen = _Seen()
    try:
        with anyio.fail_after(settings.timeout_secs):
            host, addresses = await _pin(server, settings)
            async with _connect(server, settings, host, addresses, seen) as client:
                return await act(client)
    except TimeoutError:
        failure = _http_failure(
            504,
            f"MCP server '{server.label}' did not answer within {settings.timeout_secs:g} seconds.",
        )
    except McpFailure as exc:
        failure = exc
    except Exception as exc:
        failure = _classify(exc, server, seen)
    log.warning("MCP %s on server '%s' failed: %s", what, server.label, failure.message)
    raise failure from None


async def _pin(server: McpServer, settings: HostedToolSettings) -> tuple[str, list[str]]:
    """The URL's host and the addresses to connect to, after the address policy."""
    url = httpx2.URL(server.url)
    host = url.raw_host.decode("ascii").lower()
    allowed = "*" in settings.mcp_allowed_hosts or host.strip("[]") in {
        name.lower().strip("[]") for name in settings.mcp_allowed_hosts
    }
    address = literal_address(host)
    if address is not None:
        addresses = [address]
    else:
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise _http_failure(
                502,
                f"the host '{host}' of MCP server '{server.label}' could not be resolved "
                f"({exc.strerror or exc}).",
            ) from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    refused = [a for a in addresses if address_refused(a)]
    if not addresses or (refused and not allowed):
        raise _http_failure(
            403,
            f"refusing to connect to MCP server '{server.label}' at '{host}': it resolves to "
            f"{', '.join(refused) or 'nothing'}, a loopback, private, link-local or reserved "
            "address; `--mcp-allowed-hosts` can allow it.",
        )
    return host, addresses


@dataclass
class _Seen:
    """What the HTTP layer saw during one session: the SDK reports an HTTP status or a
    connection failure only as a generic JSON-RPC error, and this recovers the cause."""

    status: int | None = None  # the last POST's status when it failed without a JSON-RPC body
    error: httpx2.TransportError | None = None


class _PinnedBackend(httpcore2.AsyncNetworkBackend):
    """Connects to `host` at one of `addresses` (the first that answers), and nowhere else."""

    def __init__(self, host: str, addresses: list[str]) -> None:
        self._host = host.strip("[]")
        self._addresses = addresses
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        if host.lower().strip("[]") != self._host:
            raise httpcore2.ConnectError(f"not connecting to '{host}': not the checked host")
        failure: Exception = httpcore2.ConnectError(f"'{host}' has no address to connect to")
        for address in self._addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Transport(httpx2.AsyncBaseTransport):
    """httpx2's own transport over the pinned backend, noting failures in `seen`."""

    def __init__(self, host: str, addresses: list[str], seen: _Seen) -> None:
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)
        # The pool is the transport's only seam for the network backend.
        self._inner._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=_PinnedBackend(host, addresses),
        )
        self._seen = seen

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            self._seen.error = exc
            raise
        if request.method == "POST":
            json_body = response.headers.get("content-type", "").startswith("application/json")
            failed = response.status_code >= 400 and not json_body
            self._seen.status = response.status_code if failed else None
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def _connect(
    server: McpServer, settings: HostedToolSettings, host: str, addresses: list[str], seen: _Seen
) -> AsyncIterator[Client]:
    """An initialized SDK client over the pinned transport."""
    from mcp.client import Client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(settings.timeout_secs)

    def http_client(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = timeout,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout,
            auth=auth,
            follow_redirects=False,
            trust_env=False,
            transport=_Transport(host, addresses, seen),
        )

    headers = server.request_headers()
    if server.sse:
        transport = sse_client(
            server.url,
            headers=headers,
            timeout=settings.timeout_secs,
            sse_read_timeout=settings.timeout_secs,
            httpx_client_factory=http_client,
        )
        async with Client(transport, cache=None) as client:
            yield client
        return
    async with http_client(headers) as http:
        transport = streamable_http_client(server.url, http_client=http)
        async with Client(transport, cache=None) as client:
            yield client


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _classify(exc: Exception, server: McpServer, seen: _Seen) -> McpFailure:
    """An SDK or HTTP failure as the item's error: the HTTP layer's own cause first (a
    status, a connection failure), then the JSON-RPC error, then whatever was raised."""
    from mcp.shared.exceptions import MCPError

    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, McpFailure):
            return leaf
    label = server.label
    if seen.error is not None:
        return _transport_failure(seen.error, label)
    for leaf in leaves:
        if isinstance(leaf, httpx2.HTTPStatusError):
            return _http_failure(
                leaf.response.status_code,
                f"MCP server '{label}' answered HTTP {leaf.response.status_code}.",
            )
    if seen.status is not None:
        return _http_failure(seen.status, f"MCP server '{label}' answered HTTP {seen.status}.")
    for leaf in leaves:
        if isinstance(leaf, httpx2.TransportError):
            return _transport_failure(leaf, label)
        if isinstance(leaf, MCPError):
            message = f"MCP server '{label}' returned error {leaf.code}: {_one_line(leaf.message)}"
            return McpFailure(
                {"type": "mcp_protocol_error", "code": leaf.code, "message": leaf.message},
                message,
            )
    first = leaves[0]
    message = f"MCP server '{label}' failed: {type(first).__name__}: {_one_line(str(first))}"
    return McpFailure(
        {"type": "mcp_protocol_error", "code": _INTERNAL_ERROR, "message": message}, message
    )


def _transport_failure(error: httpx2.TransportError, label: str) -> McpFailure:
    if isinstance(error, httpx2.TimeoutException):
        return _http_failure(504, f"MCP server '{label}' timed out ({type(error).__name__}).")
    return _http_failure(
        502,
        f"could not reach MCP server '{label}': {_one_line(str(error)) or type(error).__name__}.",
    )


class _NoTraceback(logging.Filter):
    """Keeps the SDK's failure records to their one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


for _name in _SDK_LOGGERS:
    logging.getLogger(_name).addFilter(_NoTraceback())
