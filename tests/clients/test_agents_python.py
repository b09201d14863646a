"""The OpenAI Agents SDK (Python) running agents on respd through `OpenAIResponsesModel`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest
from agents import (
    Agent,
    FileSearchTool,
    HostedMCPTool,
    ModelSettings,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import (
    ResponseFileSearchToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_output_item import McpCall, McpListTools

from tests.clients.capture import CaptureProxy
from tests.support.mcp_server import McpTestServer, mcp_server
from tests.support.servers import MODEL_ID

CLIENT = "agents-python"


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # traces would go to api.openai.com


def model(base_url: str) -> OpenAIResponsesModel:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=300)
    return OpenAIResponsesModel(model=MODEL_ID, openai_client=client)


def answering() -> ModelSettings:
    return ModelSettings(tool_choice="none", temperature=0, max_tokens=200)


@pytest.mark.flow(CLIENT, "two-tools")
def test_two_tool_agent(base_url: str) -> None:
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        ran.append(f"weather:{city}")
        return f"It is sunny in {city}."

    @function_tool
    def get_time(city: str) -> str:
        """Get the local time in a city."""
        ran.append(f"time:{city}")
        return f"It is noon in {city}."

    agent = Agent(
        name="assistant",
        instructions="Use the tools to answer.",
        tools=[get_weather, get_time],
        model=model(base_url),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60
        ),
        reset_tool_choice=True,  # "auto" once a tool has run
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=5)
    calls = [
        i.raw_item for i in result.new_items if isinstance(i.raw_item, ResponseFunctionToolCall)
    ]
    assert ran and calls and {c.name for c in calls} <= {"get_weather", "get_time"}
    assert isinstance(result.final_output, str) and result.final_output.strip()


@pytest.mark.flow(CLIENT, "handoff")
def test_handoff(base_url: str) -> None:
    specialist = Agent(
        name="specialist",
        instructions="Answer the question in one sentence.",
        model=model(base_url),
        model_settings=answering(),
    )
    triage = Agent(
        name="triage",
        instructions="Hand the conversation to the specialist.",
        handoffs=[specialist],
        model=model(base_url),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
    )
    result = Runner.run_sync(triage, "What is 2+2?", max_turns=4)
    assert result.last_agent is specialist
    assert any(i.type == "handoff_output_item" for i in result.new_items)
    assert isinstance(result.final_output, str) and result.final_output.strip()


@pytest.mark.flow(CLIENT, "previous-response-session")
def test_session_through_previous_response_id(base_url: str, proxy: CaptureProxy) -> None:
    agent = Agent(
        name="chat",
        instructions="Answer in one short sentence.",
        model=model(base_url),
        model_settings=answering(),
    )
    first = Runner.run_sync(agent, "My name is Ada.")
    assert first.last_response_id
    second = Runner.run_sync(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert isinstance(second.final_output, str) and second.final_output.strip()
    bodies = [r.body for r in proxy.seen(CLIENT, "previous-response-session") if r.body]
    assert bodies[-1]["previous_response_id"] == first.last_response_id
    # the continuation carried only the new turn; respd supplied the rest from its store
    assert len(bodies[-1]["input"]) == 1


@pytest.mark.flow(CLIENT, "conversations-session")
def test_conversations_session(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=300)

    async def run() -> list[object]:
        session = OpenAIConversationsSession(openai_client=client)
        agent = Agent(
            name="chat",
            instructions="Answer in one short sentence.",
            model=model(base_url),
            model_settings=answering(),
        )
        await Runner.run(agent, "My name is Ada.", session=session)
        await Runner.run(agent, "What is my name?", session=session)
        items = await session.get_items()
        await session.clear_session()
        return list(items)

    items = asyncio.run(run())
    users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
    assert len(users) == 2 and len(items) >= 4


@pytest.mark.flow(CLIENT, "streamed")
def test_streamed_run(base_url: str) -> None:
    agent = Agent(
        name="chat",
        instructions="Answer in one short sentence.",
        model=model(base_url),
        model_settings=ModelSettings(temperature=0, max_tokens=200),
    )

    async def run() -> tuple[str, object]:
        streamed = Runner.run_streamed(agent, "What is 2+2?")
        text = ""
        async for event in streamed.stream_events():
            if event.type == "raw_response_event" and isinstance(
                event.data, ResponseTextDeltaEvent
            ):
                text += event.data.delta
        return text, streamed.final_output

    text, final = asyncio.run(run())
    assert text and text == final


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


def _forced(max_tokens: int = 200) -> ModelSettings:
    """The agent's first turn must call its (only) tool; the model answers after it."""
    return ModelSettings(tool_choice="required", temperature=0, max_tokens=max_tokens)


@pytest.mark.flow(CLIENT, "hosted-mcp")
def test_hosted_mcp_tool(base_url: str, mcp: McpTestServer) -> None:
    """A `HostedMCPTool`: respd lists the server's tools and runs the call itself, inside the
    model's one response; the agent sees the listing and the call as run items."""
    tool = HostedMCPTool(
        tool_config={
            "type": "mcp",
            "server_label": "facts",
            "server_url": mcp.url,
            "allowed_tools": ["lookup_fact"],
            "require_approval": "never",
        }
    )
    agent = Agent(
        name="assistant",
        instructions="Look facts up with your tool, then answer.",
        tools=[tool],
        model=model(base_url),
        model_settings=_forced(),
    )
    result = Runner.run_sync(agent, "What is the secret code of otters?", max_turns=2)
    raws = [item.raw_item for item in result.new_items]
    listings = [r for r in raws if isinstance(r, McpListTools)]
    calls = [r for r in raws if isinstance(r, McpCall)]
    assert listings and [t.name for t in listings[0].tools] == ["lookup_fact"]
    assert calls and calls[0].status == "completed" and "7491" in (calls[0].output or "")
    assert isinstance(result.final_output, str) and result.final_output.strip()


@pytest.mark.flow(CLIENT, "file-search")
def test_file_search_tool(base_url: str) -> None:
    """A `FileSearchTool` over a vector store made through the same SDK: respd searches it
    inside the response; the answer cites the file holding the fact."""
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    docs = {
        "lighthouse.txt": "The lighthouse keeper's secret ingredient is smoked butter.",
        "roses.txt": "Prune the roses in early spring, before the new buds open.",
    }
    ids = {
        name: client.files.create(file=(name, text.encode()), purpose="assistants").id
        for name, text in docs.items()
    }
    store = client.vector_stores.create(name="notes", file_ids=list(ids.values()))
    for _ in range(600):
        if client.vector_stores.retrieve(store.id).file_counts.completed == len(docs):
            break
        time.sleep(0.1)
    tool = FileSearchTool(
        vector_store_ids=[store.id], max_num_results=2, include_search_results=True
    )
    agent = Agent(
        name="assistant",
        instructions="Search the user's files, then answer.",
        tools=[tool],
        model=model(base_url),
        model_settings=_forced(),
    )
    result = Runner.run_sync(
        agent, "What is the lighthouse keeper's secret ingredient?", max_turns=2
    )
    searches = [
        item.raw_item
        for item in result.new_items
        if isinstance(item.raw_item, ResponseFileSearchToolCall)
    ]
    assert searches and searches[0].status == "completed"
    assert searches[0].results and searches[0].results[0].file_id == ids["lighthouse.txt"]
    messages = [
        item.raw_item
        for item in result.new_items
        if isinstance(item.raw_item, ResponseOutputMessage)
    ]
    cited = [
        a.file_id
        for m in messages
        for part in m.content
        if part.type == "output_text"
        for a in part.annotations
        if a.type == "file_citation"
    ]
    assert ids["lighthouse.txt"] in cited
