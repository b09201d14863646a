"""Python frameworks on respd's Responses API: LangChain's `ChatOpenAI`, Pydantic AI's
`OpenAIResponsesModel` and LiteLLM's `responses()`."""

from __future__ import annotations

import asyncio
import os
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from tests.clients.capture import CaptureProxy
from tests.support.servers import MODEL_ID

# LiteLLM reads its model price list from the network unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class Weather(BaseModel):
    city: str
    temperature_c: int = Field(ge=-50, le=60)
    sky: Literal["sunny", "cloudy", "rainy"]


def langchain_model(base_url: str, **kwargs: object):  # type: ignore[no-untyped-def]
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL_ID,
        base_url=base_url,
        api_key="sk-test",  # type: ignore[arg-type]
        use_responses_api=True,
        temperature=0,
        max_retries=0,
        **kwargs,
    )


def responses_calls(proxy: CaptureProxy, client: str, flow: str) -> list[dict[str, object]]:
    return [r.body for r in proxy.seen(client, flow) if r.path == "/v1/responses" and r.body]


@pytest.mark.flow("langchain", "invoke")
def test_langchain_invoke(base_url: str, proxy: CaptureProxy) -> None:
    message = langchain_model(base_url, max_tokens=150).invoke("What is 2+2?")
    assert message.text.strip()
    assert message.usage_metadata and message.usage_metadata["output_tokens"] > 0
    assert responses_calls(proxy, "langchain", "invoke")  # the Responses API, not Chat


@pytest.mark.flow("langchain", "stream")
def test_langchain_stream(base_url: str) -> None:
    chunks = list(langchain_model(base_url, max_tokens=150).stream("What is 2+2?"))
    text = "".join(chunk.text for chunk in chunks)
    assert len(chunks) > 2 and text.strip()


@pytest.mark.flow("langchain", "bind-tools")
def test_langchain_bind_tools(base_url: str) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"It is sunny in {city}."

    llm = langchain_model(base_url, max_tokens=150)
    forced = llm.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Paris?")
    ai = forced.invoke([question])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather"
    assert isinstance(ai.tool_calls[0]["args"].get("city"), str)
    result = get_weather.invoke(ai.tool_calls[0])
    assert isinstance(result, ToolMessage)
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke([question, ai, result])
    assert answer.text.strip() and not answer.tool_calls


@pytest.mark.flow("langchain", "structured-output")
def test_langchain_structured_output(base_url: str) -> None:
    llm = langchain_model(base_url, max_tokens=120)
    for method in ("json_schema", "function_calling"):
        weather = llm.with_structured_output(Weather, method=method).invoke(
            "Describe the weather in Oslo."
        )
        assert isinstance(weather, Weather), method
        assert -50 <= weather.temperature_c <= 60


@pytest.mark.flow("pydantic-ai", "tool-agent-typed-output")
def test_pydantic_ai_agent(base_url: str, proxy: CaptureProxy) -> None:
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.usage import UsageLimits

    class ToolFirst(AbstractCapability[None]):
        """The first step must call the weather tool, the next one must give the typed answer
        (a model this small would otherwise call the tool again and again)."""

        def get_model_settings(self):  # type: ignore[no-untyped-def]
            def settings(ctx: RunContext[None]) -> ModelSettings:
                tool = "get_weather" if ctx.run_step <= 1 else "final_result"
                return {"tool_choice": [tool]}

            return settings

    provider = OpenAIProvider(base_url=base_url, api_key="sk-test")
    agent = Agent(
        OpenAIResponsesModel(MODEL_ID, provider=provider),
        output_type=Weather,
        instructions="Look the weather up with the tool, then report it.",
        model_settings={"temperature": 0, "max_tokens": 150},
        capabilities=[ToolFirst()],
    )
    looked_up: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        looked_up.append(city)
        return f"{city}: 18 degrees, cloudy."

    result = asyncio.run(
        agent.run("What is the weather in Oslo?", usage_limits=UsageLimits(request_limit=4))
    )
    assert isinstance(result.output, Weather)
    assert -50 <= result.output.temperature_c <= 60
    assert looked_up and result.usage.requests >= 2
    assert responses_calls(proxy, "pydantic-ai", "tool-agent-typed-output")


def litellm_request(base_url: str) -> dict[str, object]:
    """respd as an OpenAI-compatible provider: LiteLLM's `openai/` prefix and `api_base`."""
    return {
        "model": f"openai/{MODEL_ID}",
        "input": "What is 2+2?",
        "api_base": base_url,
        "api_key": "sk-test",
        "temperature": 0,
        "max_output_tokens": 150,
    }


@pytest.mark.flow("litellm", "responses")
def test_litellm_responses(base_url: str, proxy: CaptureProxy) -> None:
    import litellm

    response = litellm.responses(**litellm_request(base_url))
    text = "".join(
        part.text
        for item in response.output
        if getattr(item, "type", None) == "message"
        for part in item.content
    )
    assert response.status == "completed" and text.strip()
    assert responses_calls(proxy, "litellm", "responses")


@pytest.mark.flow("litellm", "responses-stream")
def test_litellm_responses_stream(base_url: str) -> None:
    import litellm

    stream = litellm.responses(**litellm_request(base_url), stream=True)
    kinds: list[str] = []
    text = ""
    for event in stream:
        kind = getattr(event.type, "value", event.type)  # LiteLLM's own enum of the names
        kinds.append(kind)
        if kind == "response.output_text.delta":
            text += event.delta
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert text.strip()
