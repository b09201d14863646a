"""The MCP client layer (`service/tools/hosted/mcp.py`) against a real MCP server (the SDK's
own, in a subprocess) over both transports: listing, calling, the request's headers on the
wire, every failure as the item's error object, the time limit, cancellation, the address
policy, and `from_tool`'s validation; no secret in a repr or a message."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import warnings
from typing import Any

import httpcore2
import pytest

from respd.protocol.errors import InvalidRequest, MissingParameter, Unsupported
from respd.service.tools.hosted import mcp
from respd.service.tools.hosted.mcp import McpFailure, McpServer, McpTool, call_tool, list_tools
from respd.service.tools.hosted.settings import HostedToolSettings
from tests.support.mcp_server import McpTestServer

LOCAL = HostedToolSettings(timeout_secs=5.0, mcp_allowed_hosts=frozenset({"127.0.0.1"}))
SECRET_HEADER = "header-secret-4242"
SECRET_TOKEN = "token-secret-9898"


@pytest.fixture
def server(mcp_test_server: McpTestServer) -> McpTestServer:
    return mcp_test_server


@pytest.fixture(params=["streamable", "sse"])
def url(request: pytest.FixtureRequest, server: McpTestServer) -> str:
    return server.url if request.param == "streamable" else server.sse_url


def entry(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "test", "server_url": url, **fields}


def at(url: str, **fields: Any) -> McpServer:
    return McpServer.from_tool(entry(url, **fields), "tools[0]")


def tool(name: str, read_only: bool = False) -> McpTool:
    annotations = {"readOnlyHint": True} if read_only else None
    return McpTool(name, None, {"type": "object"}, annotations)


async def test_lists_the_tools_with_schemas_and_annotations(url: str) -> None:
    tools = {t.name: t for t in await list_tools(at(url), LOCAL)}
    assert set(tools) == {"add", "lookup_fact", "whoami", "explode", "sleep"}
    add = tools["add"].as_item_entry()
    assert add["description"] == "Add two integers."
    assert add["input_schema"]["properties"].keys() == {"a", "b"}
    assert add["input_schema"]["required"] == ["a", "b"]
    assert add["annotations"] is None
    assert tools["lookup_fact"].annotations == {"readOnlyHint": True}
    assert tools["lookup_fact"].as_item_entry().keys() == {
        "name",
        "description",
        "input_schema",
        "annotations",
    }


async def test_calls_tools(url: str) -> None:
    server = at(url)
    assert await call_tool(server, "add", {"a": 2, "b": 3}, LOCAL) == "5"
    fact = await call_tool(server, "lookup_fact", {"topic": "Zorblax"}, LOCAL)
    assert fact == "The secret code of Zorblax is 7491."


async def test_forwards_the_headers_and_the_bearer_token(url: str) -> None:
    server = at(url, headers={"X-Test-Header": SECRET_HEADER}, authorization=SECRET_TOKEN)
    said = await call_tool(server, "whoami", {}, LOCAL)
    assert said == f"authorization=Bearer {SECRET_TOKEN} x-test-header={SECRET_HEADER}"


async def test_a_tool_error_is_an_execution_error_with_its_content(url: str) -> None:
    with pytest.raises(McpFailure) as failed:
        await call_tool(at(url), "explode", {}, LOCAL)
    assert failed.value.error["type"] == "mcp_tool_execution_error"
    assert failed.value.error["content"] == [
        {"type": "text", "text": "Error executing tool explode: kaboom"}
    ]
    assert "kaboom" in failed.value.message


@pytest.mark.waits
async def test_a_slow_tool_fails_at_the_time_limit(url: str) -> None:
    quick = HostedToolSettings(timeout_secs=0.5, mcp_allowed_hosts=LOCAL.mcp_allowed_hosts)
    start = time.monotonic()
    with pytest.raises(McpFailure) as failed:
        await call_tool(at(url), "sleep", {"seconds": 30}, quick)
    assert time.monotonic() - start < 1.5
    assert failed.value.error["type"] == "http_error"
    assert failed.value.error["code"] == 504
    assert "0.5 seconds" in failed.value.message


@pytest.mark.waits
async def test_cancelling_the_caller_stops_the_call_cleanly(url: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = asyncio.all_tasks()
        task = asyncio.create_task(call_tool(at(url), "sleep", {"seconds": 30}, LOCAL))
        await asyncio.sleep(0.5)  # well into the call: connected, the tool sleeping
        assert not task.done()
        start = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=2)
        assert time.monotonic() - start < 1
        await asyncio.sleep(0.05)
        assert asyncio.all_tasks() == before
        gc.collect()
    assert [str(w.message) for w in caught] == []


async def test_a_refused_address_is_never_contacted(server: McpTestServer) -> None:
    seen = server.requests_seen()
    for host in ("127.0.0.1", "localhost", "0x7f.1", "[::ffff:127.0.0.1]"):
        with pytest.raises(McpFailure) as failed:
            await list_tools(at(f"http://{host}:{server.port}/mcp"), HostedToolSettings())
        assert failed.value.error["type"] == "http_error"
        assert failed.value.error["code"] == 403
        assert "--mcp-allowed-hosts" in failed.value.message
        assert host.lower().strip("[]") in failed.value.message
    assert server.requests_seen() == seen


async def test_a_star_allows_any_host(server: McpTestServer) -> None:
    anywhere = HostedToolSettings(mcp_allowed_hosts=frozenset({"*"}))
    assert await call_tool(at(server.url), "add", {"a": 1, "b": 1}, anywhere) == "2"


async def test_an_allowed_host_is_matched_case_blind() -> None:
    settings = HostedToolSettings(mcp_allowed_hosts=frozenset({"LocalHost"}))
    host, addresses = await mcp._pin(at("http://LOCALHOST:9/mcp"), settings)
    assert host == "localhost"
    assert addresses and set(addresses) <= {"127.0.0.1", "::1"}


async def test_a_redirect_to_another_host_is_not_followed(server: McpTestServer) -> None:
    with pytest.raises(McpFailure) as failed:
        await list_tools(at(server.redirecting_url), LOCAL)
    assert failed.value.error["type"] == "mcp_protocol_error"
    assert "not followed" in failed.value.message


async def test_connections_go_only_to_the_checked_addresses(server: McpTestServer) -> None:
    backend = mcp._PinnedBackend("mcp.example.com", ["192.0.2.1", "127.0.0.1"])
    with pytest.raises(httpcore2.ConnectError, match="not the checked host"):
        await backend.connect_tcp("other.example", server.port)
    # The name never reaches a resolver: the checked addresses are tried in order.
    stream = await backend.connect_tcp("MCP.example.com", server.port, timeout=0.2)
    await stream.aclose()


@pytest.mark.parametrize("path", ["mcp", "sse"])
async def test_an_http_error_status_is_an_http_error(server: McpTestServer, path: str) -> None:
    with pytest.raises(McpFailure) as failed:
        await list_tools(at(f"{server.base}/fail500/{path}"), LOCAL)
    assert failed.value.error == {
        "type": "http_error",
        "code": 500,
        "message": "MCP server 'test' answered HTTP 500.",
    }


@pytest.mark.parametrize("path", ["mcp", "sse"])
async def test_an_unreachable_server_is_an_http_error(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), pytest.raises(McpFailure) as failed:
        await call_tool(at(f"http://127.0.0.1:1/{path}"), "add", {"a": 1, "b": 1}, LOCAL)
    assert failed.value.error["type"] == "http_error"
    assert failed.value.error["code"] == 502
    assert "could not reach MCP server 'test'" in failed.value.message
    ours = [r for r in caplog.records if r.name == mcp.__name__]
    assert len(ours) == 1
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in caplog.records)


async def test_secrets_stay_out_of_reprs_and_messages(server: McpTestServer) -> None:
    secret = at(
        f"{server.base}/fail500/mcp",
        headers={"X-Api-Key": SECRET_HEADER},
        authorization=SECRET_TOKEN,
    )
    texts = [repr(secret), str(secret)]
    with pytest.raises(McpFailure) as failed:
        await list_tools(secret, LOCAL)
    texts += [str(failed.value), failed.value.message, repr(failed.value.error)]
    with pytest.raises(McpFailure) as refused:
        await list_tools(secret, HostedToolSettings())
    texts += [str(refused.value), repr(refused.value.error)]
    for text in texts:
        assert SECRET_HEADER not in text
        assert SECRET_TOKEN not in text
    with pytest.raises(InvalidRequest) as invalid:
        at(server.url, headers={"X-Api-Key": SECRET_HEADER + "\n"})
    assert SECRET_HEADER not in invalid.value.message


def test_allowed_tools_filters() -> None:
    add, fact = tool("add"), tool("lookup_fact", read_only=True)
    assert at("http://h/mcp").allows(add)
    named = at("http://h/mcp", allowed_tools=["add"])
    assert named.allows(add) and not named.allows(fact)
    by_name = at("http://h/mcp", allowed_tools={"tool_names": ["lookup_fact"]})
    assert not by_name.allows(add) and by_name.allows(fact)
    read_only = at("http://h/mcp", allowed_tools={"read_only": True})
    assert not read_only.allows(add) and read_only.allows(fact)
    writing = at("http://h/mcp", allowed_tools={"read_only": False})
    assert writing.allows(add) and not writing.allows(fact)
    both = at("http://h/mcp", allowed_tools={"tool_names": ["add"], "read_only": True})
    assert not both.allows(add) and not both.allows(fact)
    assert at("http://h/mcp", allowed_tools={}).allows(add)


def test_require_approval_filters() -> None:
    add, fact, other = tool("add"), tool("lookup_fact", read_only=True), tool("other")
    assert at("http://h/mcp").needs_approval(add)
    assert at("http://h/mcp", require_approval="always").needs_approval(add)
    assert not at("http://h/mcp", require_approval="never").needs_approval(add)
    never_read_only = at("http://h/mcp", require_approval={"never": {"read_only": True}})
    assert not never_read_only.needs_approval(fact)
    assert never_read_only.needs_approval(add)
    names = at(
        "http://h/mcp",
        require_approval={
            "never": {"tool_names": ["add", "other"]},
            "always": {"tool_names": ["other"]},
        },
    )
    assert not names.needs_approval(add)
    assert names.needs_approval(other)  # named by both: asks
    assert names.needs_approval(fact)  # named by neither: asks
    always_add = at("http://h/mcp", require_approval={"always": {"tool_names": ["add"]}})
    assert always_add.needs_approval(add) and always_add.needs_approval(fact)


def test_from_tool_keeps_the_fields() -> None:
    server = McpServer.from_tool(
        entry(
            "https://mcp.example.com/sse",
            headers={"X-A": "1"},
            authorization="t",
            allowed_tools=["add"],
            require_approval="never",
            server_description="Dice.",
        ),
        "tools[2]",
    )
    assert server == McpServer(
        label="test",
        url="https://mcp.example.com/sse",
        headers={"X-A": "1"},
        authorization="t",
        allowed_tools=["add"],
        require_approval="never",
        description="Dice.",
    )
    assert server.sse and not at("https://mcp.example.com/mcp").sse
    assert server.request_headers() == {"X-A": "1", "Authorization": "Bearer t"}


@pytest.mark.parametrize(
    ("fields", "error", "param"),
    [
        ({"server_label": None}, MissingParameter, "tools[3].server_label"),
        ({"server_label": "has space"}, InvalidRequest, "tools[3].server_label"),
        ({"server_label": "x" * 65}, InvalidRequest, "tools[3].server_label"),
        ({"server_label": 7}, InvalidRequest, "tools[3].server_label"),
        ({"server_url": None}, MissingParameter, "tools[3].server_url"),
        ({"server_url": "ftp://h/mcp"}, InvalidRequest, "tools[3].server_url"),
        ({"server_url": "http:///mcp"}, InvalidRequest, "tools[3].server_url"),
        ({"server_url": ["http://h"]}, InvalidRequest, "tools[3].server_url"),
        ({"connector_id": "connector_gmail"}, Unsupported, "tools[3].connector_id"),
        ({"tunnel_id": "tun_1"}, Unsupported, "tools[3].tunnel_id"),
        ({"headers": ["X-A"]}, InvalidRequest, "tools[3].headers"),
        ({"headers": {"X-A": 1}}, InvalidRequest, "tools[3].headers.X-A"),
        ({"headers": {"Bad Name": "v"}}, InvalidRequest, "tools[3].headers"),
        ({"authorization": 5}, InvalidRequest, "tools[3].authorization"),
        ({"authorization": "a\r\nb"}, InvalidRequest, "tools[3].authorization"),
        ({"allowed_tools": "add"}, InvalidRequest, "tools[3].allowed_tools"),
        ({"allowed_tools": [1]}, InvalidRequest, "tools[3].allowed_tools"),
        ({"allowed_tools": {"names": []}}, Unsupported, "tools[3].allowed_tools.names"),
        (
            {"allowed_tools": {"read_only": "yes"}},
            InvalidRequest,
            "tools[3].allowed_tools.read_only",
        ),
        ({"require_approval": "sometimes"}, InvalidRequest, "tools[3].require_approval"),
        (
            {"require_approval": {"always": {"tool_names": "add"}}},
            InvalidRequest,
            "tools[3].require_approval.always.tool_names",
        ),
        ({"require_approval": {"maybe": {}}}, Unsupported, "tools[3].require_approval.maybe"),
        ({"server_description": 3}, InvalidRequest, "tools[3].server_description"),
    ],
)
def test_from_tool_names_the_bad_field(
    fields: dict[str, Any], error: type[InvalidRequest], param: str
) -> None:
    raw = {**entry("http://h/mcp"), **fields}
    with pytest.raises(error) as failed:
        McpServer.from_tool(raw, "tools[3]")
    assert type(failed.value) is error
    assert failed.value.param == param
