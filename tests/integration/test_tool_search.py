"""Tool search and Codex model discovery against a real server with the embedded model,
driven by the real `openai` SDK; every response and event is checked with its types.

The 135M model is forced to search (`tool_choice` names `tool_search`), so its call is
grammar-held; what is tested is the protocol: the search runs here, its two items come
back, the response goes on to an answer, and tools found (here or by the client) can be
called on the next turn."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.support.sdk_types import strict_event, strict_response
from tests.support.servers import MODEL_ID, RespdServer

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "defer_loading": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "Customer records and orders.",
    "tools": [
        {
            "type": "function",
            "name": "list_orders",
            "description": "List the open orders of a customer.",
            "defer_loading": True,
            "parameters": {"type": "object", "properties": {"customer": {"type": "string"}}},
        }
    ],
}
FORCE_SEARCH = {"type": "function", "name": "tool_search"}


def _create(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", 60)
    kw.setdefault("temperature", 0)
    raw = client.responses.with_raw_response.create(model=MODEL_ID, **kw)
    return strict_response(json.loads(raw.text))


def test_a_hosted_search_runs_here_and_the_response_goes_on(client: openai.OpenAI) -> None:
    tools = [WEATHER, CRM, {"type": "tool_search"}]
    events = []
    with client.responses.stream(
        model=MODEL_ID,
        input="What is the weather in Paris?",
        tools=tools,  # type: ignore[arg-type]
        tool_choice=FORCE_SEARCH,  # type: ignore[arg-type]
        temperature=0,
        max_output_tokens=400,  # room for several searches in the forced pass, then the answer
    ) as stream:
        for event in stream:
            events.append(strict_event(event.model_dump(mode="json")))
    # completed, or incomplete if the answer after the search ran to the token budget
    terminal = events[-1]
    assert terminal.type in ("response.completed", "response.incomplete")
    done = strict_response(terminal.response.model_dump(mode="json"))  # type: ignore[union-attr]
    kinds = [o.type for o in done.output]
    n = kinds.count("tool_search_call")  # the forced pass may search more than once
    assert n >= 1 and kinds[: 2 * n] == ["tool_search_call"] * n + ["tool_search_output"] * n
    for call in done.output[:n]:
        assert call.type == "tool_search_call"
        assert (call.execution, call.call_id, call.status) == ("server", None, "completed")
        assert isinstance(call.arguments, dict)
    for found in done.output[n : 2 * n]:
        assert found.type == "tool_search_output"
        assert found.execution == "server" and found.status == "completed"
        for tool in found.tools:  # what was found is the client's own definition
            assert tool.type in ("function", "namespace")
            assert tool.name in ("get_weather", "crm")
    rest = done.output[2 * n :]
    assert rest or done.status == "incomplete", "the response went on after its search"
    assert done.status in ("completed", "incomplete")
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == f"response.{done.status}"
    assert "response.function_call_arguments.delta" not in types  # a search streams no args
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == [o.type for o in done.output]
    assert done.usage is not None and 0 < done.usage.output_tokens <= 400  # all passes


def test_a_client_search_loads_the_tools_the_client_returns(client: openai.OpenAI) -> None:
    tools = [WEATHER, {"type": "tool_search", "execution": "client"}]
    first = _create(
        client,
        input="Weather in Paris?",
        tools=tools,
        tool_choice=FORCE_SEARCH,
        parallel_tool_calls=False,
    )
    (call,) = first.output
    assert call.type == "tool_search_call" and call.execution == "client"
    assert call.call_id and isinstance(call.arguments, dict)
    output = {
        "type": "tool_search_output",
        "execution": "client",
        "call_id": call.call_id,
        "tools": [WEATHER],
    }
    # the loaded tool can now be called (a forced choice of a tool not offered is a 400)
    second = _create(
        client,
        previous_response_id=first.id,
        input=[output],
        tools=tools,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    (fn,) = [o for o in second.output if o.type == "function_call"]
    assert fn.name == "get_weather" and "city" in json.loads(fn.arguments)


def test_deferred_tools_without_a_search_are_a_400(client: openai.OpenAI) -> None:
    try:
        _create(client, input="hi", tools=[WEATHER])
    except openai.BadRequestError as exc:
        assert exc.body is not None
        assert exc.body["param"] == "tools[0].defer_loading"  # type: ignore[index]
    else:
        raise AssertionError("a deferred tool with nothing to load it was accepted")


def test_codex_model_discovery(server: RespdServer, http: httpx.Client) -> None:
    r = http.get("/v1/models", params={"client_version": "0.171.0"})
    assert r.status_code == 200
    (model,) = r.json()["models"]
    assert model["slug"] == MODEL_ID
    health = http.get("/health").json()
    listed = http.get("/v1/models").json()["data"][0]
    assert model["context_window"] == listed["context_window"]
    assert model["auto_compact_token_limit"] < model["context_window"]
    assert model["apply_patch_tool_type"] == "freeform"
    assert "<tool_call>" in model["base_instructions"]  # SmolLM2 reads the generic format
    assert health["model"] == MODEL_ID
    etag = r.headers["etag"]
    again = http.get(
        "/v1/models", params={"client_version": "0.171.0"}, headers={"if-none-match": etag}
    )
    assert again.status_code == 304 and again.headers["etag"] == etag
    assert "object" in http.get("/v1/models").json()  # the OpenAI list, without the version
