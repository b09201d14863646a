"""Tools the server runs inside one response, through the app and the fake engine: the
model's call runs, its item finishes with the result, and the model goes on in the same
response. The web search backend is a SearxNG-protocol server on 127.0.0.1; every event and
response is checked with the SDK's types."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from respd.api.app import create_app
from respd.engines.fake import FakeEngine, Reply
from respd.service.tools.hosted.settings import HostedToolSettings
from respd.store import MemoryStore
from tests.support.fake import FAKE_MODEL, streamed
from tests.support.sdk_types import strict_response
from tests.support.searxng import Page, searxng
from tests.support.uvicorn_server import serving

PAGES = [
    Page("https://example.org/otters", "Otter facts", "Sea otters hold hands while sleeping."),
    Page("https://example.org/bees", "Bee facts", "Bees dance to share directions."),
]


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _read(call: Any) -> str:
    """Everything a generation's prompt said."""
    return "\n".join(m.text for m in call.prompt.request.messages)


def _tools(call: Any) -> list[str]:
    return [t.name for t in call.prompt.request.tools]


def _app(engine: FakeEngine, backend: str | None, **settings: Any) -> httpx.AsyncClient:
    hosted = HostedToolSettings(web_search_backend=backend, **settings)
    app = create_app(engine, MemoryStore(), hosted_tools=hosted)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_a_web_search_runs_and_the_model_answers_in_the_same_response() -> None:
    engine = FakeEngine(
        [Reply([_call("web_search", {"query": "otter sleep"})]), "Sea otters hold hands."],
        model_id=FAKE_MODEL,
    )
    with searxng(PAGES) as server:
        async with _app(engine, f"searxng:{server.url}") as http:
            body = {
                "model": FAKE_MODEL,
                "input": "How do otters sleep?",
                "tools": [{"type": "web_search"}],
                "include": ["web_search_call.action.sources"],
            }
            events = await streamed(http, body)
            metrics = (await http.get("/metrics")).text
            models = (await http.get("/v1/models")).json()["data"]
    assert models[0]["server_tools"] == ["mcp", "file_search", "web_search"]
    assert server.queries == ["otter sleep"]
    types = [e["type"] for e in events]
    searching = types.index("response.web_search_call.searching")
    assert types.index("response.web_search_call.in_progress") < searching
    assert searching < types.index("response.web_search_call.completed")
    done = events[-1]["response"]
    strict_response(done)
    assert done["status"] == "completed"
    call, answer = done["output"]
    assert call["type"] == "web_search_call" and call["status"] == "completed"
    assert call["action"]["query"] == "otter sleep"
    assert [s["url"] for s in call["action"]["sources"]] == [p.url for p in PAGES]
    text = answer["content"][0]
    assert text["text"] == "Sea otters hold hands."
    cited = [a for a in text["annotations"] if a["type"] == "url_citation"]
    assert [a["url"] for a in cited] == ["https://example.org/otters"]
    assert "response.output_text.annotation.added" in types
    # the second pass read the results: the page's text is in its prompt
    assert "hold hands while sleeping" in _read(engine.calls[1])
    usage = done["usage"]
    assert usage["input_tokens"] == sum(c.prompt.n_tokens for c in engine.calls)
    assert 'respd_server_tool_calls_total{outcome="completed",type="web_search"} 1.0' in metrics


async def test_sources_are_left_out_unless_included_and_a_failed_search_is_told() -> None:
    engine = FakeEngine(
        [Reply([_call("web_search", {"query": "bees"})]), "I could not search."],
        model_id=FAKE_MODEL,
    )
    with searxng(PAGES, status=500) as server:
        async with _app(engine, f"searxng:{server.url}") as http:
            r = await http.post(
                "/v1/responses",
                json={"model": FAKE_MODEL, "input": "Bees?", "tools": [{"type": "web_search"}]},
            )
    body = r.json()
    strict_response(body)
    call = body["output"][0]
    assert call["status"] == "failed" and body["status"] == "completed"
    assert call["action"].get("sources") is None
    assert "HTTP 500" in _read(engine.calls[1])


async def test_without_a_backend_web_search_is_left_out() -> None:
    engine = FakeEngine(["No tools."], model_id=FAKE_MODEL)
    async with _app(engine, None) as http:
        r = await http.post(
            "/v1/responses",
            json={"model": FAKE_MODEL, "input": "Hi", "tools": [{"type": "web_search"}]},
        )
        models = (await http.get("/v1/models")).json()["data"]
    assert r.status_code == 200
    assert _tools(engine.calls[0]) == []
    assert models[0]["server_tools"] == ["mcp", "file_search"]  # web search is off


async def test_max_tool_calls_caps_server_calls() -> None:
    search = Reply([_call("web_search", {"query": "again"})])
    engine = FakeEngine([search, search, "Done."], model_id=FAKE_MODEL)
    with searxng(PAGES) as server:
        async with _app(engine, f"searxng:{server.url}") as http:
            r = await http.post(
                "/v1/responses",
                json={
                    "model": FAKE_MODEL,
                    "input": "Search",
                    "tools": [{"type": "web_search"}],
                    "max_tool_calls": 1,
                },
            )
    body = r.json()
    strict_response(body)
    assert len(server.queries) == 1
    kinds = [(o["type"], o.get("status")) for o in body["output"]]
    # the second pass was offered no tools: its call text is plain text, not a call
    assert kinds[0] == ("web_search_call", "completed")
    assert _tools(engine.calls[0]) == ["web_search", "open_page"]
    assert _tools(engine.calls[1]) == []


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "web_search", "search_context_size": "huge"}, "tools[0].search_context_size"),
        ({"type": "file_search"}, "tools[0].vector_store_ids"),
        ({"type": "file_search", "vector_store_ids": "vs_1"}, "tools[0].vector_store_ids"),
        (
            {"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 99},
            "tools[0].max_num_results",
        ),
    ],
)
async def test_bad_server_tools_are_400s_naming_the_field(tool: dict[str, Any], param: str) -> None:
    engine = FakeEngine(["x"], model_id=FAKE_MODEL)
    async with _app(engine, "searxng:http://127.0.0.1:9") as http:
        r = await http.post(
            "/v1/responses", json={"model": FAKE_MODEL, "input": "Hi", "tools": [tool]}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def _indexed_store(
    http: httpx.AsyncClient, docs: dict[str, str]
) -> tuple[str, dict[str, str]]:
    """A vector store holding `docs` (name → text), once every file is indexed."""
    ids = {}
    for name, text in docs.items():
        r = await http.post(
            "/v1/files", files={"file": (name, text.encode())}, data={"purpose": "assistants"}
        )
        assert r.status_code == 200, r.text
        ids[name] = r.json()["id"]
    r = await http.post("/v1/vector_stores", json={"name": "docs", "file_ids": list(ids.values())})
    assert r.status_code == 200, r.text
    store = r.json()["id"]
    for _ in range(200):
        counts = (await http.get(f"/v1/vector_stores/{store}")).json()["file_counts"]
        if counts["completed"] == len(docs):
            return store, ids
        await asyncio.sleep(0.05)
    raise AssertionError(f"the files were not indexed: {counts}")


async def test_a_file_search_runs_over_the_vector_store_and_the_answer_cites_the_file() -> None:
    engine = FakeEngine(
        [Reply([_call("file_search", {"queries": ["lighthouse keeper"]})]), "Butter."],
        model_id=FAKE_MODEL,
    )
    app = create_app(engine, MemoryStore())
    async with serving(app) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        store, ids = await _indexed_store(
            http,
            {
                "risotto.txt": "The lighthouse keeper stirs the risotto with butter.",
                "roses.txt": "Prune the roses in early spring.",
            },
        )
        tool = {"type": "file_search", "vector_store_ids": [store], "max_num_results": 2}
        base = {"model": FAKE_MODEL, "input": "Who stirs?", "tools": [tool]}
        events = await streamed(http, {**base, "include": ["file_search_call.results"]})
        missing = await http.post(
            "/v1/responses",
            json={**base, "tools": [{**tool, "vector_store_ids": ["vs_nope"]}]},
        )
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "tools[0].vector_store_ids"
    types = [e["type"] for e in events]
    assert types.index("response.file_search_call.searching") < types.index(
        "response.file_search_call.completed"
    )
    done = strict_response(events[-1]["response"])
    call, answer = done.output
    assert call.type == "file_search_call" and call.queries == ["lighthouse keeper"]
    assert call.results and call.results[0].file_id == ids["risotto.txt"]
    (citation,) = answer.content[0].annotations
    assert citation.type == "file_citation" and citation.file_id == ids["risotto.txt"]
    assert citation.filename == "risotto.txt"
    assert "lighthouse keeper stirs" in _read(engine.calls[1])
