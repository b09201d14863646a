"""`mcp` tools through the app and the fake engine, against the `mcp` SDK's own server on
127.0.0.1 (a subprocess): the server lists the tools once per conversation, runs the calls
the model makes (or asks the client to approve them first), and a failing tool becomes a
failed `mcp_call` the model reads. The credentials sent for the MCP server are never echoed
nor stored. Every event and response is checked with the SDK's types."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.tools.hosted.settings import HostedToolSettings
from respd.store import MemoryStore, Store
from respd.store.sqlite import SqliteStore
from tests.support.fake import FAKE_MODEL, streamed
from tests.support.mcp_server import McpTestServer
from tests.support.sdk_types import EVENT_ADAPTER, strict_response
from tests.support.uvicorn_server import serving

SECRET_HEADER = "hdr-5f1e-secret"
SECRET_TOKEN = "tok-9a7c-secret"


@pytest.fixture
def server(mcp_test_server: McpTestServer) -> McpTestServer:
    return mcp_test_server


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _tool(server: McpTestServer, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "lab", "server_url": server.url, **fields}


async def _answer(
    http: httpx.AsyncClient, first: dict[str, Any], item: dict[str, Any], tools: list[Any]
) -> dict[str, Any]:
    """The next turn after `first`, its input one item (an approval's answer)."""
    body = {"model": FAKE_MODEL, "previous_response_id": first["id"], "input": [item]}
    r = await http.post("/v1/responses", json={**body, "tools": tools})
    return dict(r.json())


def _read(call: Any) -> str:
    return "\n".join(m.text for m in call.prompt.request.messages)


async def _client(
    engine: FakeEngine,
    store: Store | None = None,
    allowed: frozenset[str] = frozenset({"127.0.0.1"}),
) -> AsyncIterator[httpx.AsyncClient]:
    hosted = HostedToolSettings(timeout_secs=3, mcp_allowed_hosts=allowed)
    app = create_app(engine, store or MemoryStore(), hosted_tools=hosted)
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        yield http


async def test_a_forced_mcp_call_runs_and_the_model_reads_its_output(
    server: McpTestServer,
) -> None:
    engine = FakeEngine(
        [Reply([_call("lab__add", {"a": 2, "b": 3})]), "The sum is 5."], model_id=FAKE_MODEL
    )
    async for http in _client(engine):
        body = {
            "model": FAKE_MODEL,
            "input": "Add 2 and 3.",
            "tools": [_tool(server, require_approval="never")],
            "tool_choice": {"type": "mcp", "server_label": "lab", "name": "add"},
        }
        events = await streamed(http, body)
    types = [e["type"] for e in events]
    for expected in (
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ):
        assert expected in types
    done = strict_response(events[-1]["response"])
    listing, call, answer = done.output
    assert listing.type == "mcp_list_tools" and listing.server_label == "lab"
    assert {"add", "lookup_fact", "whoami"} <= {t.name for t in listing.tools}
    assert call.type == "mcp_call" and call.status == "completed"
    assert (call.name, json.loads(call.arguments), call.output) == ("add", {"a": 2, "b": 3}, "5")
    assert answer.type == "message"
    # the first pass was forced onto the tool; the second read its output
    first_tools = [t.name for t in engine.calls[0].prompt.request.tools]
    assert "lab__add" in first_tools
    tool_turns = [m for m in engine.calls[1].prompt.request.messages if m.role == "tool"]
    assert [m.text for m in tool_turns] == ["5"]


async def test_approval_then_the_call_runs_in_the_next_turn_without_listing_again(
    server: McpTestServer,
) -> None:
    engine = FakeEngine(
        [Reply([_call("lab__lookup_fact", {"topic": "otters"})]), "Code 7491."],
        model_id=FAKE_MODEL,
    )
    async for http in _client(engine):
        tools = [_tool(server)]  # approval is required unless the request says otherwise
        first = (
            await http.post(
                "/v1/responses", json={"model": FAKE_MODEL, "input": "Otters?", "tools": tools}
            )
        ).json()
        strict_response(first)
        _listing, request = first["output"]
        assert request["type"] == "mcp_approval_request" and request["name"] == "lookup_fact"
        assert len(engine.calls) == 1  # nothing ran: the client decides first
        approval = {
            "type": "mcp_approval_response",
            "approval_request_id": request["id"],
            "approve": True,
        }
        second = await _answer(http, first, approval, tools)
    strict_response(second)
    call, _message = second["output"]  # no second listing: the chain holds one
    assert call["type"] == "mcp_call" and call["approval_request_id"] == request["id"]
    assert call["status"] == "completed" and "7491" in call["output"]
    assert "7491" in _read(engine.calls[1])


async def test_a_declined_call_is_not_run_and_the_model_is_told(server: McpTestServer) -> None:
    engine = FakeEngine(
        [Reply([_call("lab__add", {"a": 1, "b": 1})]), "Fine."], model_id=FAKE_MODEL
    )
    async for http in _client(engine):
        tools = [_tool(server)]
        first = (
            await http.post(
                "/v1/responses", json={"model": FAKE_MODEL, "input": "Add", "tools": tools}
            )
        ).json()
        request = first["output"][-1]
        declined = {
            "type": "mcp_approval_response",
            "approval_request_id": request["id"],
            "approve": False,
            "reason": "not now",
        }
        second = await _answer(http, first, declined, tools)
    strict_response(second)
    assert [o["type"] for o in second["output"]] == ["message"]
    assert "Not run: not now." in _read(engine.calls[1])


async def test_a_failing_tool_is_a_failed_item_and_the_response_completes(
    server: McpTestServer,
) -> None:
    engine = FakeEngine([Reply([_call("lab__explode", {})]), "It failed."], model_id=FAKE_MODEL)
    async for http in _client(engine):
        body = {
            "model": FAKE_MODEL,
            "input": "Explode.",
            "tools": [_tool(server, require_approval="never")],
        }
        events = await streamed(http, body)
    assert "response.mcp_call.failed" in [e["type"] for e in events]
    done = strict_response(events[-1]["response"])
    assert done.status == "completed"
    call = done.output[1]
    assert call.type == "mcp_call" and call.status == "failed" and call.error is not None
    assert "kaboom" in _read(engine.calls[1])


async def test_a_loopback_server_not_allowed_is_a_listing_error(server: McpTestServer) -> None:
    engine = FakeEngine(["No tools."], model_id=FAKE_MODEL)
    seen = server.requests_seen()
    async for http in _client(engine, allowed=frozenset()):
        body = {"model": FAKE_MODEL, "input": "Hi", "tools": [_tool(server)]}
        data = (await http.post("/v1/responses", json=body)).json()
    strict_response(data)
    listing = data["output"][0]
    assert listing["type"] == "mcp_list_tools" and "--mcp-allowed-hosts" in listing["error"]
    assert server.requests_seen() == seen  # no connection was made
    assert engine.calls[0].prompt.request.tools == []


async def test_credentials_are_neither_echoed_nor_stored(
    server: McpTestServer, tmp_path: Path
) -> None:
    engine = FakeEngine([Reply([_call("lab__add", {"a": 1, "b": 2})]), "3."], model_id=FAKE_MODEL)
    path = tmp_path / "respd.sqlite"
    tool = _tool(
        server,
        require_approval="never",
        headers={"X-Test-Header": SECRET_HEADER},
        authorization=SECRET_TOKEN,
    )
    # credentials in the URL itself are the server's too: used, never echoed
    tool["server_url"] = tool["server_url"].replace("http://", f"http://user:{SECRET_TOKEN}x@")
    async for http in _client(engine, SqliteStore(path)):
        r = await http.post(
            "/v1/responses", json={"model": FAKE_MODEL, "input": "1+2", "tools": [tool]}
        )
        data = r.json()
        strict_response(data)
        fetched = (await http.get(f"/v1/responses/{data['id']}")).text
    assert data["output"][1]["output"] == "3"
    for secret in (SECRET_HEADER, SECRET_TOKEN):
        assert secret not in r.text and secret not in fetched
        for file in tmp_path.iterdir():
            assert secret.encode() not in file.read_bytes(), file


@pytest.mark.waits
async def test_a_background_response_runs_its_call_and_a_cancel_stops_a_hanging_one(
    server: McpTestServer,
) -> None:
    engine = FakeEngine(
        [
            Reply([_call("lab__add", {"a": 4, "b": 5})]),
            "Nine.",
            Reply([_call("lab__sleep", {"seconds": 30})]),
        ],
        model_id=FAKE_MODEL,
    )
    tools = [_tool(server, require_approval="never")]
    async for http in _client(engine):
        body = {"model": FAKE_MODEL, "input": "4+5", "tools": tools, "background": True}
        queued = (await http.post("/v1/responses", json=body)).json()
        for _ in range(200):
            done = (await http.get(f"/v1/responses/{queued['id']}")).json()
            if done["status"] not in ("queued", "in_progress"):
                break
            await asyncio.sleep(0.05)
        strict_response(done)
        assert done["status"] == "completed"
        assert [o["type"] for o in done["output"]] == ["mcp_list_tools", "mcp_call", "message"]
        assert done["output"][1]["output"] == "9"
        hanging = (await http.post("/v1/responses", json={**body, "input": "Sleep"})).json()
        await asyncio.sleep(1)  # the fake engine is instant: the call is running
        started = time.monotonic()
        cancelled = (await http.post(f"/v1/responses/{hanging['id']}/cancel")).json()
        assert time.monotonic() - started < 2  # the call stopped: no 30 s wait, nor 3 s limit
    strict_response(cancelled)
    assert cancelled["status"] == "cancelled"
    call = cancelled["output"][-1]
    assert call["type"] == "mcp_call" and call["status"] == "incomplete"


def test_the_websocket_mode_runs_server_calls_in_its_responses(server: McpTestServer) -> None:
    engine = FakeEngine(
        [Reply([_call("lab__add", {"a": 2, "b": 2})]), "Four."], model_id=FAKE_MODEL
    )
    hosted = HostedToolSettings(mcp_allowed_hosts=frozenset({"127.0.0.1"}))
    app = create_app(engine, MemoryStore(), hosted_tools=hosted)
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        ws.send_json(
            {
                "type": "response.create",
                "model": FAKE_MODEL,
                "input": "2+2",
                "tools": [_tool(server, require_approval="never")],
            }
        )
        events = []
        while not events or events[-1]["type"] not in ("response.completed", "response.failed"):
            events.append(ws.receive_json())
            EVENT_ADAPTER.validate_python(events[-1])
    done = strict_response(events[-1]["response"])
    assert done.status == "completed"
    assert [o.type for o in done.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert "response.mcp_call.completed" in [e["type"] for e in events]


@pytest.mark.waits
async def test_a_client_that_hangs_up_stops_the_running_call(server: McpTestServer) -> None:
    """Closing the stream mid-call cancels the call: it never finishes (a call left running
    would fail at its 1 s limit and be counted), and the server answers the next request."""
    engine = FakeEngine(
        [Reply([_call("lab__sleep", {"seconds": 30})]), "Next answer."], model_id=FAKE_MODEL
    )
    hosted = HostedToolSettings(timeout_secs=1, mcp_allowed_hosts=frozenset({"127.0.0.1"}))
    app = create_app(engine, MemoryStore(), hosted_tools=hosted)
    tools = [_tool(server, require_approval="never")]
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        body = {"model": FAKE_MODEL, "input": "Sleep", "tools": tools, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as r:
            async for line in r.aiter_lines():
                if "response.mcp_call.in_progress" in line:
                    break  # the call is running: hang up
        await asyncio.sleep(1.5)
        assert ("mcp", "failed") not in app.state.toolbox.calls
        after = await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "Hi"})
    assert after.status_code == 200 and after.json()["output"][0]["content"][0]["text"]


@pytest.mark.waits
async def test_a_shutdown_stops_a_running_call_as_it_stops_generation(
    server: McpTestServer,
) -> None:
    """Draining waits its grace for a running call, then cancels it: the response ends
    `incomplete` with the call's item incomplete, long before the call's own limit."""
    engine = FakeEngine([Reply([_call("lab__sleep", {"seconds": 30})])], model_id=FAKE_MODEL)
    hosted = HostedToolSettings(timeout_secs=20, mcp_allowed_hosts=frozenset({"127.0.0.1"}))
    app = create_app(engine, MemoryStore(), hosted_tools=hosted)
    body = {
        "model": FAKE_MODEL,
        "input": "Sleep",
        "tools": [_tool(server, require_approval="never")],
    }
    async with (
        serving(app) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http,
    ):
        events: list[dict[str, Any]] = []
        drained: list[int] = []

        async def read() -> None:
            async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if events[-1]["type"] == "response.mcp_call.in_progress":
                            drained.append(await app.state.runs.drain(0.2))

        started = time.monotonic()
        await asyncio.wait_for(read(), 10)
    assert time.monotonic() - started < 8  # not the call's 20 s limit
    assert drained == [1]  # the call was the one thing left to stop
    done = strict_response(events[-1]["response"])
    assert done.status == "incomplete"
    call = next(o for o in done.output if o.type == "mcp_call")
    assert call.status == "incomplete"
