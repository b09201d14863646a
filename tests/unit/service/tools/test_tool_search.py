"""Tool search over the app and the fake engine: deferred tools stay out of the prompt, the
model is shown a `tool_search` function, a hosted search runs here and loads what it found
into the next pass of the same response, and a client-executed search comes back for the
client to answer. Every response and event is checked with the SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from respd.engines.base import Prompt, SamplingParams
from respd.engines.fake import FakeEngine, Reply
from respd.service.tools.tool_search import Deferred, search
from tests.support.fake import FAKE_MODEL, created
from tests.support.sdk_types import strict_event, strict_response

ORDERS = {
    "type": "function",
    "name": "list_open_orders",
    "description": "List open orders for a customer ID.",
    "defer_loading": True,
    "parameters": {
        "type": "object",
        "properties": {"customer_id": {"type": "string"}},
        "required": ["customer_id"],
    },
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather forecast for a city.",
    "defer_loading": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM tools for customer lookup and order management.",
        "tools": [ORDERS],
    },
    WEATHER,
    {"type": "tool_search"},
]


class Script:
    """The fake model writes each of `calls` in turn (one per generation), then answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def respond(self, prompt: Prompt, params: SamplingParams) -> Reply:
        if not self.calls:
            return Reply(["Done."])
        name, arguments = self.calls.pop(0)
        if not name:  # written as given
            return Reply([arguments["text"]])
        call = json.dumps({"name": name, "arguments": arguments})
        return Reply([f"<tool_call>\n{call}\n</tool_call>"])


@pytest.fixture()
def script() -> Script:
    return Script()


@pytest.fixture()
def engine(script: Script) -> FakeEngine:
    return FakeEngine(respond=script.respond, model_id=FAKE_MODEL)


def _shown(engine: FakeEngine, call: int = -1) -> list[str]:
    return [t.name for t in engine.calls[call].prompt.request.tools]


async def test_deferred_tools_are_left_out_and_the_search_is_shown(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    data = await created(http, input="hi", tools=TOOLS)
    assert data["status"] == "completed"
    assert _shown(engine) == ["lookup", "tool_search"]
    search_tool = engine.calls[-1].prompt.request.tools[-1]
    # the model is told what it can search: the namespace and the deferred function
    assert search_tool.description is not None
    assert "crm: CRM tools" in search_tool.description
    assert "get_weather: Get the weather" in search_tool.description
    assert [t["type"] for t in data["tools"]] == [t["type"] for t in TOOLS]  # echoed as sent


async def test_a_hosted_search_loads_the_tools_it_found_into_the_next_pass(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    script.calls = [
        ("tool_search", {"query": "open orders of a customer"}),
        ("crm__list_open_orders", {"customer_id": "c1"}),
    ]
    r = await http.post(
        "/v1/responses",
        json={"model": FAKE_MODEL, "input": "orders?", "tools": TOOLS, "stream": True},
    )
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    final = strict_response(events[-1]["response"])
    assert final.status == "completed"
    kinds = [item.type for item in final.output]
    assert kinds == ["tool_search_call", "tool_search_output", "function_call"]
    call, found, fn = final.output
    assert call.type == "tool_search_call" and found.type == "tool_search_output"
    assert (call.execution, call.call_id, call.status) == ("server", None, "completed")
    assert call.arguments == {"query": "open orders of a customer"}
    assert found.execution == "server"
    (space,) = found.tools
    assert space.type == "namespace" and space.name == "crm"
    assert [t.name for t in space.tools] == ["list_open_orders"]
    assert fn.type == "function_call"
    assert (fn.name, fn.namespace) == ("list_open_orders", "crm")
    # two passes: the second shows the tool found and the search's result
    assert len(engine.calls) == 2
    assert _shown(engine, 1) == ["lookup", "tool_search", "crm__list_open_orders"]
    last = engine.calls[1].prompt.request.messages
    assert last[-1].role == "tool" and "crm__list_open_orders" in last[-1].text
    assert final.usage is not None
    assert final.usage.input_tokens == sum(c.prompt.n_tokens for c in engine.calls)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_tools_found_earlier_are_offered_on_a_chained_turn(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    script.calls = [("tool_search", {"paths": ["get_weather"]})]
    first = await created(http, input="weather?", tools=TOOLS)
    assert [i["type"] for i in first["output"]] == [
        "tool_search_call",
        "tool_search_output",
        "message",
    ]
    assert [t["name"] for t in first["output"][1]["tools"]] == ["get_weather"]
    await created(http, input="and tomorrow?", tools=TOOLS, previous_response_id=first["id"])
    assert _shown(engine) == ["lookup", "tool_search", "get_weather"]
    messages = engine.calls[-1].prompt.request.messages
    assert [c.name for m in messages for c in m.tool_calls] == ["tool_search"]


async def test_a_client_search_returns_the_call_and_loads_what_the_client_sends(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    tools = [*TOOLS[:-1], {"type": "tool_search", "execution": "client"}]
    script.calls = [("tool_search", {"paths": ["crm"]})]
    first = await created(http, input="orders?", tools=tools)
    (call,) = first["output"]
    assert call["type"] == "tool_search_call" and call["execution"] == "client"
    assert call["call_id"] and call["arguments"] == {"paths": ["crm"]}
    assert len(engine.calls) == 1  # this server does not run a client's search
    output = {
        "type": "tool_search_output",
        "execution": "client",
        "call_id": call["call_id"],
        "tools": [{**TOOLS[1], "tools": [ORDERS]}],
    }
    await created(http, input=[output], tools=tools, previous_response_id=first["id"])
    assert _shown(engine) == ["lookup", "tool_search", "crm__list_open_orders"]
    last = engine.calls[-1].prompt.request.messages[-1]
    assert (last.role, last.tool_call_id) == ("tool", call["call_id"])


async def test_searches_stop_at_max_tool_calls(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    script.calls = [("tool_search", {"query": "weather"})] * 3
    data = await created(http, input="weather?", tools=TOOLS, max_tool_calls=1)
    assert [i["type"] for i in data["output"]][:2] == ["tool_search_call", "tool_search_output"]
    assert len(engine.calls) == 2
    assert "tool_search" not in _shown(engine, 1)  # searched enough: no longer offered


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([WEATHER], "tools[0].defer_loading"),
        (
            [{"type": "namespace", "name": "crm", "description": "d", "tools": [ORDERS]}],
            "tools[0].tools[0].defer_loading",
        ),
        ([{"type": "tool_search"}, {"type": "tool_search"}], "tools[1]"),
        ([{"type": "tool_search", "execution": "nowhere"}], "tools[0].execution"),
        (
            [{**WEATHER, "parameters": {"type": "array"}}, {"type": "tool_search"}],
            "tools[0].parameters",
        ),
    ],
)
async def test_bad_tool_search_setups_are_400s(
    http: httpx.AsyncClient, engine: FakeEngine, tools: list[dict[str, Any]], param: str
) -> None:
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "x", "tools": tools})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert not engine.calls


def test_search_by_query_ranks_names_over_descriptions() -> None:
    deferred = [
        Deferred(ORDERS, ("crm", "CRM tools for customer lookup and order management.")),
        Deferred(WEATHER),
    ]
    assert [t["name"] for t in search({"query": "weather in Paris"}, deferred)] == ["get_weather"]
    (space,) = search({"query": "customer orders"}, deferred)
    assert space["type"] == "namespace" and space["tools"] == [ORDERS]
    assert search({"query": "nothing relevant"}, deferred) == []
    # paths name a namespace, one of its tools, or a top-level function exactly
    assert search({"paths": ["crm.list_open_orders"]}, deferred)[0]["name"] == "crm"
    assert search({"paths": ["get_weather"], "query": "orders"}, deferred) == [WEATHER]


async def test_a_forced_search_holds_for_the_first_pass_only(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    script.calls = [("tool_search", {"query": "weather"})]
    choice = {"type": "function", "name": "tool_search"}
    data = await created(http, input="weather?", tools=TOOLS, tool_choice=choice)
    assert [i["type"] for i in data["output"]] == [
        "tool_search_call",
        "tool_search_output",
        "message",
    ]
    first, second = (c.prompt.request.constraint for c in engine.calls)
    assert first is not None and second is None  # the answer after the search is free


async def test_max_output_tokens_bounds_every_pass_together(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    script.calls = [("tool_search", {"query": "weather"})]
    first_call = len(json.dumps({"name": "tool_search", "arguments": {"query": "weather"}}))
    budget = first_call + 40  # the call's tags and JSON, then a little for the answer
    data = await created(http, input="weather?", tools=TOOLS, max_output_tokens=budget)
    assert len(engine.calls) == 2
    passes = [c.params.max_tokens for c in engine.calls]
    assert passes[0] == budget and passes[1] is not None and passes[1] < budget
    assert data["usage"]["output_tokens"] <= budget


async def test_two_searches_in_one_pass_each_get_their_output_in_order(
    http: httpx.AsyncClient, engine: FakeEngine, script: Script
) -> None:
    calls = [
        json.dumps({"name": "tool_search", "arguments": {"query": q}})
        for q in ("weather", "orders")
    ]
    text = "".join(f"<tool_call>\n{c}\n</tool_call>\n" for c in calls)
    script.calls = [("", {"text": text})]
    first = await created(http, input="both?", tools=TOOLS)
    kinds = [i["type"] for i in first["output"]]
    assert kinds == ["tool_search_call"] * 2 + ["tool_search_output"] * 2 + ["message"]
    found = [[t["name"] for t in i["tools"]] for i in first["output"][2:4]]
    assert found == [["get_weather"], ["crm"]]
    # replayed, each output answers its own search: the first the first
    await created(http, input="ok", tools=TOOLS, previous_response_id=first["id"])
    messages = engine.calls[-1].prompt.request.messages
    ids = [c.id for m in messages for c in m.tool_calls]
    answers = [m for m in messages if m.role == "tool"]
    assert [m.tool_call_id for m in answers] == ids
    assert "get_weather" in answers[0].text and "crm__list_open_orders" in answers[1].text
