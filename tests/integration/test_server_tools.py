"""Tools the server runs itself, on the embedded model behind a real server, driven by the
real `openai` SDK: an MCP server's tools (the `mcp` SDK's own server on 127.0.0.1, allowed by
`--mcp-allowed-hosts`), and web search against a SearxNG-protocol server on 127.0.0.1.

The 135M model is forced to call (`tool_choice`), so its call is grammar-held; what is tested
is the protocol: the call runs here, its item finishes with the result, the response goes on
to an answer in the same response, and every item and event is the SDK's type."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.conftest import SHARED_CAP
from tests.support.mcp_server import McpTestServer, mcp_server
from tests.support.pg import fresh_schema
from tests.support.sdk_types import strict_event, strict_response
from tests.support.searxng import Page, SearxNG, searxng
from tests.support.servers import MODEL_ID, RespdServer, start_server

SECRET_HEADER = "hdr-31d7-secret"
SECRET_TOKEN = "tok-77b2-secret"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
PAGES = [
    Page("https://example.org/otters", "Otter facts", "Sea otters hold hands while they sleep."),
    Page("https://example.org/bees", "Bee facts", "Bees dance to tell where flowers are."),
]


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


@pytest.fixture(scope="module")
def search() -> Iterator[SearxNG]:
    with searxng(PAGES) as running:
        yield running


@pytest.fixture(scope="module")
def tools_server(
    tmp_path_factory: pytest.TempPathFactory, search: SearxNG
) -> Iterator[RespdServer]:
    tmp = tmp_path_factory.mktemp("respd-tools")
    srv = start_server(
        tmp,
        "--store",
        "sqlite",
        "--data-dir",
        str(tmp / "data"),
        "--web-search-backend",
        f"searxng:{search.url}",
        "--mcp-allowed-hosts",
        "127.0.0.1",
        "--server-tool-timeout-secs",
        "3",
        *SHARED_CAP,
        preset="small",
    )
    yield srv
    srv.stop()
    srv.assert_no_5xx()


@pytest.fixture
def tclient(tools_server: RespdServer) -> openai.OpenAI:
    return tools_server.client()


def _mcp_tool(server: McpTestServer, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "facts", "server_url": server.url, **fields}


# Forced calls: the budget holds the call, then an answer (the whole response's, every pass).
BUDGET = 200


def _create(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", BUDGET)
    kw.setdefault("temperature", 0)
    raw = client.responses.with_raw_response.create(model=MODEL_ID, **kw)
    return strict_response(json.loads(raw.text))


def _stream(client: openai.OpenAI, **kw: Any) -> tuple[list[str], Any]:
    kw.setdefault("temperature", 0)
    types, last = [], None
    kw.setdefault("max_output_tokens", BUDGET)
    with client.responses.stream(model=MODEL_ID, **kw) as stream:
        for event in stream:
            strict_event(event.model_dump(mode="json", exclude_unset=True))
            types.append(event.type)
            last = event
    assert last is not None and last.type in TERMINAL, types
    return types, strict_response(last.response.model_dump(mode="json"))


def test_a_forced_mcp_call_runs_here_and_the_answer_reads_its_result(
    tclient: openai.OpenAI, mcp: McpTestServer
) -> None:
    types, done = _stream(
        tclient,
        input="What is the secret code of otters? Look it up.",
        tools=[_mcp_tool(mcp, require_approval="never", allowed_tools=["lookup_fact", "add"])],
        tool_choice={"type": "mcp", "server_label": "facts", "name": "lookup_fact"},
    )
    assert done.status == "completed"
    listing, call, answer = done.output[0], done.output[1], done.output[-1]
    assert listing.type == "mcp_list_tools"
    assert {t.name for t in listing.tools} == {"lookup_fact", "add"}  # allowed_tools holds
    assert call.type == "mcp_call" and call.status == "completed" and call.name == "lookup_fact"
    assert call.output is not None and "7491" in call.output
    assert answer.type == "message"
    assert "7491" in answer.content[0].text  # the model went on with the result it read
    for event_type in ("response.mcp_call_arguments.done", "response.mcp_call.completed"):
        assert event_type in types
    # one response, two passes: its usage counts both prompts
    assert done.usage is not None and done.usage.input_tokens > 2 * done.usage.output_tokens


def test_approval_is_asked_then_the_approved_call_runs_next_turn(
    tclient: openai.OpenAI, mcp: McpTestServer
) -> None:
    tools = [_mcp_tool(mcp, allowed_tools=["add"])]
    first = _create(
        tclient,
        input="Add 20 and 22.",
        tools=tools,
        tool_choice={"type": "mcp", "server_label": "facts", "name": "add"},
    )
    request = first.output[-1]
    assert request.type == "mcp_approval_request" and request.name == "add"
    approval = {
        "type": "mcp_approval_response",
        "approval_request_id": request.id,
        "approve": True,
    }
    second = _create(tclient, previous_response_id=first.id, input=[approval], tools=tools)
    assert second.output[0].type == "mcp_call"  # listed once in the chain, not again
    call = second.output[0]
    assert call.approval_request_id == request.id and call.status == "completed"
    args = json.loads(call.arguments)
    assert call.output == str(args["a"] + args["b"])


def test_a_hanging_mcp_tool_fails_its_item_and_the_response_ends(
    tclient: openai.OpenAI, mcp: McpTestServer
) -> None:
    done = _create(
        tclient,
        input="Wait a minute.",
        tools=[_mcp_tool(mcp, require_approval="never", allowed_tools=["sleep"])],
        tool_choice={"type": "mcp", "server_label": "facts", "name": "sleep"},
    )
    call = next(o for o in done.output if o.type == "mcp_call")
    assert call.status == "failed" and call.error is not None
    assert done.status in ("completed", "incomplete")


def test_the_mcp_credentials_are_nowhere_in_the_database(
    tclient: openai.OpenAI, mcp: McpTestServer, tools_server: RespdServer
) -> None:
    tool = _mcp_tool(
        mcp,
        require_approval="never",
        allowed_tools=["add"],
        headers={"X-Test-Header": SECRET_HEADER},
        authorization=SECRET_TOKEN,
    )
    done = _create(
        tclient,
        input="Add 1 and 2.",
        tools=[tool],
        tool_choice={"type": "mcp", "server_label": "facts", "name": "add"},
    )
    assert next(o for o in done.output if o.type == "mcp_call").status == "completed"
    data = Path(tools_server.args[tools_server.args.index("--data-dir") + 1])
    files = [f for f in data.rglob("*") if f.is_file()]
    assert any(f.name.endswith(".sqlite") or "sqlite" in f.name for f in files), files
    for file in files:
        blob = file.read_bytes()
        assert SECRET_HEADER.encode() not in blob and SECRET_TOKEN.encode() not in blob, file
    assert SECRET_TOKEN not in tools_server.log() and SECRET_HEADER not in tools_server.log()


def test_a_forced_web_search_runs_on_searxng_and_the_answer_cites_a_page(
    tclient: openai.OpenAI, search: SearxNG
) -> None:
    before = len(search.queries)
    types, done = _stream(
        tclient,
        input="How do sea otters sleep?",
        tools=[{"type": "web_search", "search_context_size": "low"}],
        tool_choice={"type": "web_search_preview"},  # the SDK's name for the choice
        include=["web_search_call.action.sources"],
        # One search, then the answer: left free, the model may search again first.
        max_tool_calls=1,
    )
    assert len(search.queries) == before + 1
    call = done.output[0]
    assert call.type == "web_search_call" and call.status == "completed"
    assert call.action.type == "search" and call.action.query == search.queries[-1]
    assert [s.url for s in call.action.sources or []] == [p.url for p in PAGES]
    answer = done.output[-1]
    assert answer.type == "message"
    cited = [a for a in answer.content[0].annotations if a.type == "url_citation"]
    assert cited and {a.url for a in cited} <= {p.url for p in PAGES}
    for event_type in (
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_text.annotation.added",
    ):
        assert event_type in types


DOCS = {
    "risotto.md": "# Risotto\n\nStir the rice slowly with warm stock. The lighthouse keeper's "
    "secret ingredient is a knob of smoked butter.",
    "roses.txt": "Prune the roses in early spring, before the new buds open.",
    "cars.txt": "The sedan broke down on the highway and was towed to a garage.",
}


def _indexed_store(client: openai.OpenAI) -> tuple[str, dict[str, str]]:
    ids = {
        name: client.files.create(file=(name, text.encode()), purpose="assistants").id
        for name, text in DOCS.items()
    }
    store = client.vector_stores.create(name="kitchen", file_ids=list(ids.values()))
    deadline = time.monotonic() + 60
    while client.vector_stores.retrieve(store.id).file_counts.completed < len(DOCS):
        assert time.monotonic() < deadline, "the files were not indexed"
        time.sleep(0.1)
    return store.id, ids


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RespdServer]:
    """A server on PostgreSQL, for file search over a store kept there."""
    with fresh_schema() as dsn:
        srv = start_server(
            tmp_path_factory.mktemp("respd-tools-pg"), "--store", dsn, *SHARED_CAP, preset="small"
        )
        yield srv
        srv.stop()
        srv.assert_no_5xx()


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
def test_a_forced_file_search_runs_over_the_store_and_the_answer_cites_the_file(
    request: pytest.FixtureRequest, store_kind: str
) -> None:
    fixture = "tools_server" if store_kind == "sqlite" else "pg_server"
    tclient = request.getfixturevalue(fixture).client()
    store, ids = _indexed_store(tclient)
    types, done = _stream(
        tclient,
        input="What is the lighthouse keeper's secret ingredient?",
        tools=[{"type": "file_search", "vector_store_ids": [store], "max_num_results": 2}],
        tool_choice={"type": "file_search"},
        include=["file_search_call.results"],
    )
    call = done.output[0]
    assert call.type == "file_search_call" and call.status == "completed" and call.queries
    assert call.results and call.results[0].file_id == ids["risotto.md"]
    assert "smoked butter" in (call.results[0].text or "")
    answer = done.output[-1]
    assert answer.type == "message"
    cited = [a for a in answer.content[0].annotations if a.type == "file_citation"]
    assert cited and cited[0].file_id == ids["risotto.md"] and cited[0].filename == "risotto.md"
    for event_type in (
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.file_search_call.completed",
    ):
        assert event_type in types
