"""Tool types beyond `function` over the app and the fake engine: namespaces, custom
(freeform) tools, the local shell and hosted tools, in both directions (the model's call
becomes the right output item; the item sent back becomes the right prompt turn)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from respd.engines.base import Prompt, SamplingParams
from respd.engines.fake import FakeEngine, Reply
from tests.support.fake import FAKE_MODEL, created
from tests.support.sdk_types import strict_event, strict_response

PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
            }
        ],
    },
    {"type": "custom", "name": "apply_patch", "description": "Edit files."},
    {"type": "local_shell"},
    {"type": "web_search", "external_web_access": False},
    {"type": "shell", "environment": {"type": "container_auto"}},
]
# OpenAI's client-run shell and file-edit tools (without a container, the client runs them).
CLIENT_TOOLS = [{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}]


class Caller:
    """The fake model calls `name` with `arguments` (once; then it answers in text)."""

    name = ""
    arguments: dict[str, Any] = {}

    def respond(self, prompt: Prompt, params: SamplingParams) -> Reply:
        if not self.name:
            return Reply(["Done."])
        call = json.dumps({"name": self.name, "arguments": self.arguments})
        self.name = ""
        return Reply([f"<tool_call>\n{call}\n</tool_call>"])


@pytest.fixture()
def caller() -> Caller:
    return Caller()


@pytest.fixture()
def engine(caller: Caller) -> FakeEngine:
    return FakeEngine(respond=caller.respond, model_id=FAKE_MODEL)


async def _stream(http: httpx.AsyncClient, **body: Any) -> list[dict[str, Any]]:
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, "stream": True, **body})
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        strict_event(event)
    return events


def _shown(engine: FakeEngine) -> list[str]:
    return [t.name for t in engine.calls[-1].prompt.request.tools]


async def test_hosted_tools_are_left_out_and_the_rest_are_shown(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    data = await created(http, input="hi", tools=TOOLS)
    assert data["status"] == "completed"
    assert _shown(engine) == ["exec_command", "agents__spawn", "apply_patch", "local_shell"]
    # the tools echo as sent
    assert [t["type"] for t in data["tools"]] == [t["type"] for t in TOOLS]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {
            "type": "computer_use_preview",
            "display_width": 1024,
            "display_height": 768,
            "environment": "linux",
        },
        {"type": "computer"},
        {"type": "image_generation"},
    ],
)
async def test_tools_this_server_cannot_run_are_a_400_naming_them(
    http: httpx.AsyncClient, engine: FakeEngine, tool: dict[str, Any]
) -> None:
    """Refused rather than left out: an answer made without them would pretend otherwise."""
    body = {"model": FAKE_MODEL, "input": "hi", "tools": [TOOLS[0], tool]}
    r = await http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools[1].type" and error["code"] == "unsupported_parameter"
    assert f"'{tool['type']}'" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert not engine.calls  # nothing generated
    listed = await http.get("/v1/responses", params={"limit": 5})
    assert listed.status_code != 200 or not listed.json().get("data")  # nothing stored
    choice = {"model": FAKE_MODEL, "input": "hi", "tools": [TOOLS[0]], "tool_choice": tool}
    refused = await http.post("/v1/responses", json=choice)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice.type"


async def test_a_namespace_call_names_its_function_and_namespace(
    http: httpx.AsyncClient, caller: Caller, engine: FakeEngine
) -> None:
    caller.name, caller.arguments = "agents__spawn", {"task": "look"}
    first = await created(http, input="hi", tools=TOOLS)
    (call,) = first["output"]
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn", "agents")
    assert json.loads(call["arguments"]) == {"task": "look"}
    # answered, the call replays under the name the model was shown
    await created(
        http,
        previous_response_id=first["id"],
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}],
    )
    messages = engine.calls[-1].prompt.request.messages
    assert [c.name for m in messages for c in m.tool_calls] == ["agents__spawn"]
    assert messages[-1].role == "tool" and messages[-1].text == "ok"


async def test_a_custom_call_carries_its_input_text_and_streams_input_events(
    http: httpx.AsyncClient, caller: Caller, engine: FakeEngine
) -> None:
    caller.name, caller.arguments = "apply_patch", {"input": PATCH}
    events = await _stream(http, input="edit", tools=TOOLS)
    types = [e["type"] for e in events]
    assert "response.custom_tool_call_input.delta" in types
    assert "response.function_call_arguments.delta" not in types
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == PATCH
    deltas = "".join(
        e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"
    )
    assert deltas == PATCH
    final = strict_response(events[-1]["response"])
    (item,) = final.output
    assert item.type == "custom_tool_call"
    assert (item.name, item.input) == ("apply_patch", PATCH)
    # its output answers it on the next turn; the prompt shows the call as the model wrote it
    await created(
        http,
        previous_response_id=final.id,
        tools=TOOLS,
        input=[{"type": "custom_tool_call_output", "call_id": item.call_id, "output": "Done!"}],
    )
    messages = engine.calls[-1].prompt.request.messages
    (shown,) = [c for m in messages for c in m.tool_calls]
    assert (shown.name, json.loads(shown.arguments)) == ("apply_patch", {"input": PATCH})
    assert messages[-1].text == "Done!"


async def test_a_local_shell_call_is_an_exec_action(
    http: httpx.AsyncClient, caller: Caller, engine: FakeEngine
) -> None:
    caller.name, caller.arguments = "local_shell", {"command": ["ls", "-la"]}
    first = await created(http, input="list", tools=TOOLS)
    (item,) = first["output"]
    assert item["type"] == "local_shell_call"
    assert item["action"]["type"] == "exec" and item["action"]["command"] == ["ls", "-la"]
    await created(
        http,
        previous_response_id=first["id"],
        tools=TOOLS,
        input=[{"type": "local_shell_call_output", "id": item["call_id"], "output": "a.txt"}],
    )
    last = engine.calls[-1].prompt.request.messages[-1]
    assert (last.role, last.name, last.text) == ("tool", "local_shell", "a.txt")


async def test_a_client_may_replay_the_items_of_a_history_it_keeps(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """`store: false` clients (Codex) send the whole history back, hosted tool records,
    `phase` and namespaced calls included."""
    history = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
        {
            "type": "message",
            "role": "assistant",
            "phase": "commentary",
            "content": [{"type": "output_text", "text": "Working."}],
        },
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "spawn",
            "namespace": "agents",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c2", "output": "spawned"},
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "c3",
            "status": "completed",
            "action": {"type": "exec", "command": ["pwd"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "c3", "output": "/tmp"},
    ]
    data = await created(http, input=history, tools=TOOLS, store=False)
    assert data["status"] == "completed"
    messages = engine.calls[-1].prompt.request.messages
    # a web search (run by OpenAI, its results not in the item) is shown as the call it was
    assert [c.name for m in messages for c in m.tool_calls] == [
        "web_search",
        "apply_patch",
        "agents__spawn",
        "local_shell",
    ]
    tool_texts = [m.text for m in messages if m.role == "tool"]
    assert tool_texts == ["Search results were not kept.", "ok", "spawned", "/tmp"]


async def test_forcing_a_custom_tool_constrains_the_call_to_it(
    http: httpx.AsyncClient, caller: Caller, engine: FakeEngine
) -> None:
    caller.name, caller.arguments = "apply_patch", {"input": PATCH}
    await created(
        http, input="edit", tools=TOOLS, tool_choice={"type": "custom", "name": "apply_patch"}
    )
    constraint = engine.calls[-1].prompt.request.constraint
    assert constraint is not None and constraint.calls is not None
    assert [t.name for t in constraint.calls.tools] == ["apply_patch"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        ({"tool_choice": {"type": "custom", "name": "nope"}}, "tool_choice.name"),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "name": "t",
                        "format": {"type": "grammar", "syntax": "lark", "definition": "a: b"},
                    }
                ]
            },
            "tools[0].format.definition",
        ),
        (
            {
                "tools": [
                    {
                        "type": "custom",
                        "name": "t",
                        "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"},
                    }
                ]
            },
            "tools[0].format.syntax",
        ),
        ({"tools": [{"type": "namespace", "name": "n"}]}, "tools[0].tools"),
        ({"tools": [{"type": "teleport"}]}, "tools[0].type"),
    ],
)
async def test_bad_tools_are_400s_naming_the_field(
    http: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    body.setdefault("tools", TOOLS)
    r = await http.post("/v1/responses", json={"model": FAKE_MODEL, "input": "hi", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


async def test_shell_and_apply_patch_calls_come_back_as_their_own_items(
    http: httpx.AsyncClient, caller: Caller, engine: FakeEngine
) -> None:
    caller.name, caller.arguments = "shell", {"commands": ["ls -la"], "timeout_ms": 5000}
    events = await _stream(http, input="list", tools=CLIENT_TOOLS)
    assert _shown(engine) == ["shell", "apply_patch"]
    final = strict_response(events[-1]["response"])
    (call,) = final.output
    assert call.type == "shell_call" and call.action.commands == ["ls -la"]
    assert call.action.timeout_ms == 5000 and call.status == "completed"
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["shell_call"]
    output = {
        "type": "shell_call_output",
        "call_id": call.call_id,
        "output": [{"stdout": "a.txt", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    }
    caller.name, caller.arguments = (
        "apply_patch",
        {
            "type": "create_file",
            "path": "b.txt",
            "diff": "+hello",
        },
    )
    second = await created(http, previous_response_id=final.id, input=[output], tools=CLIENT_TOOLS)
    tool_turn = engine.calls[-1].prompt.request.messages[-1]
    assert tool_turn.role == "tool" and tool_turn.text == "a.txt\n[exit code 0]"
    (patch,) = second["output"]
    assert patch["type"] == "apply_patch_call"
    assert patch["operation"] == {"type": "create_file", "path": "b.txt", "diff": "+hello"}
    # the call and its output replay from a client's own history too
    history = [
        {"role": "user", "content": "make b"},
        {k: patch[k] for k in ("type", "call_id", "operation", "status")},
        {"type": "apply_patch_call_output", "call_id": patch["call_id"], "status": "completed"},
    ]
    await created(http, input=history, tools=CLIENT_TOOLS)
    messages = engine.calls[-1].prompt.request.messages
    assert [c.name for m in messages for c in m.tool_calls] == ["apply_patch"]
    assert messages[-1].text == "completed:"
    # a shell or apply_patch call can be forced
    caller.name, caller.arguments = "shell", {"commands": ["pwd"]}
    forced = await created(http, input="where", tools=CLIENT_TOOLS, tool_choice={"type": "shell"})
    assert forced["output"][0]["type"] == "shell_call"
    constraint = engine.calls[-1].prompt.request.constraint
    assert constraint is not None and [t.name for t in constraint.calls.tools] == ["shell"]


async def test_a_client_tool_output_must_answer_a_call_of_that_tool(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    r = await http.post(
        "/v1/responses",
        json={
            "model": FAKE_MODEL,
            "tools": CLIENT_TOOLS,
            "input": [{"type": "shell_call_output", "call_id": "nope", "output": []}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].call_id"
    assert engine.calls == []
