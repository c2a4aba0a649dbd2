"""Agent and structured-output libraries on `localspec serve`'s chat completions, for real: the command in a
subprocess on loopback with the embedded Gemma 3 270M, driven by instructor, pydantic-ai and openai-agents
(through ``OpenAIChatCompletionsModel``; its Responses model is tests/test_responses_api.py's). Each test checks
what a user of the library gets back: its objects, its usage, what its tools were called with. The model is small
and weak, so nothing here asks it to be right, only that every library's protocol lands: a forced call comes back
as a call that parses into the library's types, and costs a call's tokens, not max_tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel

from tests.test_serve import Server, start

EXTRACT = "Paris is the capital of France. Extract the city."
ASK_WEATHER = "What is the weather in Paris?"
# room for a runaway answer: a forced call that does not end where its JSON does would spend all of it; a call
# costs ~25 tokens. (The bug fixed in 99e10db, the calls grammar's free whitespace, ran the Qwen pair on to
# max_tokens; greedy Gemma ends after its call even at 0f55e20, before that fix, so here the check catches an answer
# that cannot end after a complete call, e.g. the end token forbidden there, not a model that chooses whitespace.)
ROOM = 300
CALL_COST = 100


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """Two sequences, greedy by default; no --max-tokens-cap, so that ROOM is accepted."""
    yield from start("--parallel", "2", "--ctx", "2048", "-n", "32")


def async_client(server: Server) -> openai.AsyncOpenAI:
    # no retries: a failed request must fail the test, not be sent again
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def weather_tool(cities: list[str]) -> Callable[[str], str]:
    """A tool that records each city it was called with: a call whose arguments did not validate never gets here."""

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"It is sunny in {city}."

    return get_weather


# -- instructor --


@pytest.mark.parametrize(("mode", "finish"), [("JSON_SCHEMA", "stop"), ("TOOLS", "tool_calls")])
def test_instructor_returns_the_model_at_a_calls_own_cost(server: Server, mode: str, finish: str) -> None:
    """JSON_SCHEMA sends OpenAI's response_format; TOOLS sends the model as one tool and tool_choice naming it (a
    forced call, which ran on to max_tokens before 99e10db). Either way the answer ends at the object's close."""
    import instructor

    client = instructor.from_openai(openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120),
                                    mode=getattr(instructor.Mode, mode))
    # max_retries=0: one attempt; instructor would otherwise ask again with the validation error, hiding a bad answer
    city, completion = client.chat.completions.create_with_completion(
        model="default", response_model=City, messages=[{"role": "user", "content": EXTRACT}], max_tokens=ROOM,
        temperature=0, max_retries=0)
    assert isinstance(city, City) and isinstance(city.name, str) and isinstance(city.country, str)
    choice = completion.choices[0]
    assert choice.finish_reason == finish, completion
    if mode == "TOOLS":
        assert [call.function.name for call in choice.message.tool_calls or []] == ["City"], completion
    # the answer ended where its JSON did: a forced call that runs on to max_tokens costs all ROOM
    assert completion.usage is not None and completion.usage.completion_tokens < CALL_COST, completion.usage


# -- pydantic-ai --


def test_pydantic_ai_output_type_is_an_output_tool_call_whole_and_streamed(server: Server) -> None:
    from pydantic_ai import Agent, ModelSettings
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def agent() -> Agent[None, City]:
        # a client of its own for each event loop (run_sync's, asyncio.run's): an httpx pool is bound to its loop
        model = OpenAIChatModel("default", provider=OpenAIProvider(openai_client=async_client(server)))
        # a structured output_type is an output tool (final_result) under tool_choice "required": a forced call
        return Agent(model, output_type=City, model_settings=ModelSettings(temperature=0, max_tokens=ROOM))

    result = agent().run_sync(EXTRACT)
    assert isinstance(result.output, City), result.output
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    assert len(responses) == 1 and responses[0].finish_reason == "tool_call", responses  # no retry was needed
    assert [p.tool_name for p in responses[0].parts if isinstance(p, ToolCallPart)] == ["final_result"]
    usage = result.usage
    assert usage.requests == 1 and 0 < usage.output_tokens < CALL_COST, usage

    # streamed: pydantic-ai puts the call together from its tool_calls deltas
    async def streamed() -> object:
        async with agent().run_stream(EXTRACT) as run:
            return await run.get_output()

    assert isinstance(asyncio.run(streamed()), City)


def test_pydantic_ai_tool_loop_runs_the_tool_and_ends_with_text(server: Server) -> None:
    from pydantic_ai import Agent, ModelSettings, RunContext, UsageLimits
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class CallFirst(AbstractCapability[None]):
        """The tool forced on the first step only (pydantic-ai refuses a static "required": nothing could end the
        run), as its docs say to: left free ("auto"), this 270M model writes about the tool instead of calling it."""

        def get_model_settings(self) -> Callable[[RunContext[None]], ModelSettings]:
            return lambda ctx: ModelSettings(tool_choice="required") if ctx.run_step <= 1 else ModelSettings()

    cities: list[str] = []
    model = OpenAIChatModel("default", provider=OpenAIProvider(openai_client=async_client(server)))
    agent = Agent(model, instructions="Use the get_weather tool to answer.", capabilities=[CallFirst()],
                  model_settings=ModelSettings(temperature=0, max_tokens=40))
    agent.tool_plain(weather_tool(cities))
    try:
        result = agent.run_sync(ASK_WEATHER, usage_limits=UsageLimits(request_limit=4))
    except UsageLimitExceeded:  # the model's choice after the first step, not the protocol's: each was a valid call
        assert len(cities) >= 3, cities
    else:
        assert isinstance(result.output, str) and result.output, result.output
        messages = result.all_messages()
        # the call, its result sent back to the model, then the answer in text
        assert any(isinstance(p, ToolCallPart) and p.tool_name == "get_weather"
                   for m in messages if isinstance(m, ModelResponse) for p in m.parts), messages
        assert any(isinstance(p, ToolReturnPart) and p.content == f"It is sunny in {cities[0]}."
                   for m in messages for p in m.parts), messages
        last = messages[-1]
        assert isinstance(last, ModelResponse) and isinstance(last.parts[-1], TextPart), last
    # the first step's forced call ran the function with an argument that validated as its str
    assert cities and all(isinstance(city, str) and city.strip() for city in cities), cities


# -- openai-agents, through chat completions --


def test_openai_agents_on_chat_completions_runs_the_required_tool_whole_and_streamed(server: Server) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        ToolCallItem,
        ToolCallOutputItem,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # nowhere to send traces to, and no key for it
    cities: list[str] = []

    async def run() -> None:
        client = async_client(server)
        # stop_on_first_tool: the tool's output is the run's final output, so the run is one forced call
        agent = Agent(name="weather", instructions="Use the tool.", tools=[function_tool(weather_tool(cities))],
                      model=OpenAIChatCompletionsModel("default", client), tool_use_behavior="stop_on_first_tool",
                      model_settings=ModelSettings(temperature=0.0, max_tokens=60, tool_choice="required"))
        whole = await Runner.run(agent, ASK_WEATHER)
        assert len(cities) == 1 and whole.final_output == f"It is sunny in {cities[0]}.", (cities, whole)
        assert [type(item) for item in whole.new_items] == [ToolCallItem, ToolCallOutputItem], whole.new_items
        # streamed: the call put together from its tool_calls deltas, then run
        streamed = Runner.run_streamed(agent, ASK_WEATHER)
        kinds = {event.type async for event in streamed.stream_events()}
        assert {"raw_response_event", "run_item_stream_event"} <= kinds, kinds
        assert len(cities) == 2 and streamed.final_output == f"It is sunny in {cities[1]}.", (cities, streamed)
        await client.close()

    asyncio.run(run())
    assert all(isinstance(city, str) and city.strip() for city in cities), cities
