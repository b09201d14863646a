"""The OpenAI Agents SDK drives respd through `OpenAIResponsesModel`: a forced first turn
calls the tool, the SDK runs it and sends `function_call_output`, the next turn answers."""

from __future__ import annotations

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import ResponseFunctionToolCall

from tests.servers import MODEL_ID, RespdServer


def test_agent_runs_its_tool_and_answers(server: RespdServer) -> None:
    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        seen.append(city)
        return f"It is sunny and 21 degrees in {city}."

    agent = Agent(
        name="weather",
        instructions="Answer weather questions using the get_weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL_ID, openai_client=server.async_client()),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60
        ),
        # after the tool ran the SDK drops tool_choice, i.e. "auto" for the next turn
        reset_tool_choice=True,
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert len(seen) >= 1 and all(isinstance(c, str) and c for c in seen)
    calls = [
        item.raw_item
        for item in result.new_items
        if isinstance(item.raw_item, ResponseFunctionToolCall)
    ]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert len(result.raw_responses) >= 2


def test_agent_with_tool_choice_none_answers_directly(server: RespdServer) -> None:
    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        raise AssertionError("tool_choice none must not call tools")

    agent = Agent(
        name="weather",
        instructions="Be brief.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL_ID, openai_client=server.async_client()),
        # Greedy, with room to finish: the test is about tool_choice, not the token budget.
        model_settings=ModelSettings(tool_choice="none", temperature=0, max_tokens=200),
    )
    result = Runner.run_sync(agent, "Say hello.", max_turns=2)
    assert isinstance(result.final_output, str) and result.final_output.strip()
