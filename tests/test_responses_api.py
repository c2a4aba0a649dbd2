"""OpenAI's Responses API (`POST /v1/responses`, serve/responses_api.py), for real: `localspec serve` in a subprocess on
loopback with the embedded Gemma, driven by the official `openai` client's ``responses`` and by openai-agents'
``OpenAIResponsesModel``. Every event and Response is also validated against the client's own pydantic types (the
client itself builds them without validating, so a wrong shape would pass it unseen)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from localspec.serve.pieces import CallPiece, FailedPiece, Piece, TextPiece
from localspec.serve.protocol import ApiError
from localspec.serve.responses_api import ResponsesAnswer, read
from tests.test_serve import Server, start

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 40},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False},
           "strict": True}
CONVERT = {"type": "function", "name": "convert", "description": "Convert an amount of money to another currency",
           "parameters": {"type": "object", "properties": {
               "amount": {"type": "number", "maximum": 1000000},
               "to": {"enum": ["EUR", "USD", "GBP"]}},
               "required": ["amount", "to"], "additionalProperties": False},
           "strict": True}
TOOLS = [WEATHER, CONVERT]
ASK_WEATHER = "What is the weather in Paris, in celsius?"


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """Two sequences, greedy by default, a request's max tokens capped at 96: enough for a call and a short turn."""
    yield from start("--parallel", "2", "--ctx", "2048", "-n", "32", "--max-tokens-cap", "96")


def _fits(tool: dict[str, Any], arguments: str) -> dict[str, Any]:
    """The call's arguments, parsed, checked against its tool's parameters (the two schemas here: required keys,
    no others, enums)."""
    value = json.loads(arguments)
    schema = tool["parameters"]
    assert isinstance(value, dict) and set(schema["required"]) <= set(value) <= set(schema["properties"]), value
    for key, rule in schema["properties"].items():
        if "enum" in rule:
            assert value[key] in rule["enum"], value
    return value


def _raw_events(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events read off the wire: each ``event:`` line names its data's type, and each validates."""
    status, headers, raw = server.http("POST", "/v1/responses", {**body, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_input_is_a_response_with_its_text_usage_and_timings(server: Server) -> None:
    client = server.client()
    response = client.responses.create(model="default", input="Write one sentence about the sea.",
                                       max_output_tokens=24, temperature=0, metadata={"run": "1"}, store=True)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.output_text
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    if response.status == "incomplete":  # the model went on past the limit: OpenAI's own way of saying so
        assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.metadata == {"run": "1"} and response.temperature == 0
    extra = response.model_extra or {}
    assert extra["store"] is False and extra["timings"]["predicted_n"] == usage.output_tokens  # stateless
    Response.model_validate(response.model_dump())
    # instructions are a system message before the input: the prompt grows by them
    instructed = client.responses.create(model="default", input="Write one sentence about the sea.",
                                         instructions="You are a poet who writes about the ocean.",
                                         max_output_tokens=8, temperature=0)
    assert instructed.usage is not None and instructed.usage.input_tokens > usage.input_tokens + 5
    assert instructed.instructions == "You are a poet who writes about the ocean."


def test_a_stream_is_typed_events_whose_text_deltas_join_to_the_output_text(server: Server) -> None:
    client = server.client()
    body: dict[str, Any] = {"model": "default", "input": "Write one sentence about the sea.", "max_output_tokens": 24,
                            "temperature": 0}
    events = list(client.responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    done = next(e for e in events if e.type == "response.output_text.done")
    assert "".join(deltas) == done.text == final.response.output_text and done.text
    assert final.response.usage is not None and final.response.usage.output_tokens > 0
    whole = client.responses.create(**body)
    assert whole.output_text == done.text  # greedy: the same answer, whole or streamed
    # on the wire: an ``event:`` line per event, sequence numbers 0, 1, …, and every event as the client types it
    # (how the text falls into deltas depends on how many tokens each pass gave: compare the rest)
    raw = _raw_events(server, body)
    assert [e["type"] for e in raw if not e["type"].endswith(".delta")] == \
        [kind for kind in kinds if not kind.endswith(".delta")]
    assert "".join(e["delta"] for e in raw if e["type"] == "response.output_text.delta") == done.text


def test_a_forced_call_is_a_function_call_item_and_streams_its_arguments_in_deltas(server: Server) -> None:
    client = server.client()
    response = client.responses.create(model="default", input=ASK_WEATHER, tools=TOOLS, tool_choice="required",
                                       max_output_tokens=60, temperature=0)
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and calls, response.output
    for call in calls:
        assert call.id and call.id.startswith("fc_") and call.call_id and call.status == "completed"
        _fits(next(t for t in TOOLS if t["name"] == call.name), call.arguments)
    assert [t.name for t in response.tools] == ["get_weather", "convert"] and response.tool_choice == "required"
    # streamed: the item added with empty arguments, then its arguments in pieces that join to the done event's
    with client.responses.stream(model="default", input="Convert 20 euros to US dollars.", tools=TOOLS,
                                 tool_choice={"type": "function", "name": "convert"}, max_output_tokens=60,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "convert" and added.item.arguments == ""
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(deltas) > 1 and "".join(deltas) == done.arguments and done.name == "convert"
    assert {e.item_id for e in events if e.type == "response.function_call_arguments.delta"} == {added.item.id}
    item = final.output[0]
    assert item.type == "function_call" and item.arguments == done.arguments and item.call_id == added.item.call_id
    _fits(CONVERT, done.arguments)
    assert events[-1].type == "response.completed"


def test_the_next_turn_with_the_call_and_its_output_gets_an_answer(server: Server) -> None:
    client = server.client()
    first = client.responses.create(model="default", input=ASK_WEATHER, tools=TOOLS, tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    call = next(item for item in first.output if item.type == "function_call")
    result = '{"temperature": 18, "sky": "clear"}'
    # the items as the client holds them (ids and statuses included), then the call's output
    turn = [{"role": "user", "content": ASK_WEATHER}, *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    then = client.responses.create(model="default", input=turn, tools=TOOLS, max_output_tokens=24, temperature=0)
    assert then.output and then.status in ("completed", "incomplete")
    assert then.output_text or any(item.type == "function_call" for item in then.output), then.output
    # the call and its result went into the prompt, the template's way
    assert first.usage is not None and then.usage is not None
    assert then.usage.input_tokens >= first.usage.input_tokens + len(result) // 4 + len(call.arguments) // 4


def test_text_format_json_schema_gives_json_that_fits(server: Server) -> None:
    class City(BaseModel):
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)
        population: int

    client = server.client()
    parsed = client.responses.parse(model="default", input="Describe Paris as JSON: name, country, population.",
                                    text_format=City, max_output_tokens=60, temperature=0)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    assert parsed.text is not None and parsed.text.format is not None and parsed.text.format.type == "json_schema"
    schema = {"type": "json_schema", "name": "city", "schema": City.model_json_schema(), "strict": True}
    events = _raw_events(server, {"model": "default", "input": "Describe Paris as JSON: name, country, population.",
                                  "text": {"format": schema}, "max_output_tokens": 60, "temperature": 0})
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert City.model_validate_json(text) == parsed.output_parsed
    json_object = client.responses.create(model="default", input="Give Paris's population as a JSON object.",
                                          text={"format": {"type": "json_object"}}, max_output_tokens=40,
                                          temperature=0)
    # JSON, though this model may write keys until the limit: then it is JSON cut short, and says so
    if json_object.status == "completed":
        assert isinstance(json.loads(json_object.output_text), dict)
    else:
        assert json_object.incomplete_details is not None and json_object.output_text.startswith("{")


def test_previous_response_id_is_a_400_saying_to_send_the_conversation(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().responses.create(model="default", input="and then?", previous_response_id="resp_123")
    assert caught.value.param == "previous_response_id" and "input" in caught.value.message


@pytest.mark.parametrize(("extra", "param"), [
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools.1.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                             {"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input.0.content.1"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "c",
                                                   "output": [{"type": "input_file", "file_id": "f"}]}]},
     "input.1.output.0"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
    ({"include": ["message.output_text.logprobs"]}, "include.0"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}}, "text.format"),
    ({"input": [{"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": 3}]},
     "input.1.arguments"),
    ({"input": [{"role": "user", "content": "x\ud800"}]}, "input.0.content"),
])
def test_what_cannot_be_done_is_a_400_naming_the_responses_field(server: Server, extra: dict[str, Any],
                                                                   param: str) -> None:
    status, _, raw = server.http("POST", "/v1/responses", {"model": "default", "input": "hi", **extra})
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert "messages" not in error["message"] and "response_format" not in error["message"], error


def test_fields_that_ask_for_nothing_are_accepted(server: Server) -> None:
    response = server.client().responses.create(
        model="default", input=[{"type": "message", "role": "developer", "content": "Be brief."},
                                {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
        store=False, include=[], truncation="disabled", reasoning={}, user="u1", parallel_tool_calls=False,
        top_p=1, tool_choice="none", tools=[WEATHER], max_output_tokens=4, temperature=0)
    assert response.output_text and all(item.type == "message" for item in response.output)


def test_openai_agents_runs_on_the_responses_model(server: Server) -> None:
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"It is sunny in {city}."

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        model = OpenAIResponsesModel("default", client)
        # this small base model seldom ends a turn by itself: a newline ends it (localspec's ``stop``, beside
        # OpenAI's fields), so that a turn completes rather than reaching its limit (which the agent takes as a
        # failure, as it should)
        short = {"temperature": 0.0, "extra_body": {"stop": ["\n"]}}
        plain = Agent(name="plain", instructions="Answer briefly.", model=model,
                      model_settings=ModelSettings(max_tokens=40, **short))
        result = await Runner.run(plain, "What is the capital of France?")
        assert isinstance(result.final_output, str) and result.final_output
        # a tool it must call: the call runs the function with valid arguments; after it the choice is free
        # (openai-agents resets it), so the model answers, or calls again until the turns run out
        helper = Agent(name="helper", instructions="Use the tool.", model=model, tools=[get_weather],
                       model_settings=ModelSettings(max_tokens=60, tool_choice="required", **short))
        try:
            result = await Runner.run(helper, "What is the weather in Paris?", max_turns=4)
        except MaxTurnsExceeded:  # the model's choice, not the protocol's: every turn was a valid call
            assert len(cities) >= 3
        else:
            assert isinstance(result.final_output, str) and result.final_output
        assert cities and all(isinstance(city, str) and city for city in cities)
        # streamed, ending with the tool's own output
        cities.clear()
        streamed = Agent(name="streamed", instructions="Use the tool.", model=model, tools=[get_weather],
                         tool_use_behavior="stop_on_first_tool",
                         model_settings=ModelSettings(max_tokens=60, temperature=0.0, tool_choice="required"))
        run_ = Runner.run_streamed(streamed, "What is the weather in Paris?")
        kinds = [event.type async for event in run_.stream_events()]
        assert "raw_response_event" in kinds and len(cities) == 1
        assert run_.final_output == f"It is sunny in {cities[0]}."
        await client.close()

    asyncio.run(run())


def test_a_failure_mid_stream_is_response_failed_with_what_was_sent() -> None:
    """The answer's own translation, fed pieces as the scheduler gives them: a failure after text and a call's start
    closes the open item and ends with ``response.failed``; an error in the stream itself adds an ``error`` event."""
    body, echo = read({"model": "default", "input": "x", "tools": [WEATHER]})
    assert body.request.tools is not None and echo.fields["tools"][0]["name"] == "get_weather"

    async def pieces() -> AsyncIterator[Piece]:
        yield TextPiece("Let me look. ")
        yield CallPiece(0, "call_1", "get_weather", '{"city": ')
        yield CallPiece(0, "call_1", None, '"Par')
        yield FailedPiece(500, "the model failed")

    async def collect(answer: ResponsesAnswer) -> list[dict[str, Any]]:
        out = [chunk async for chunk in answer.stream(pieces(), False)]
        return [json.loads(b.split(b"\ndata: ", 1)[1]) for chunk in out for b in chunk.split(b"\n\n") if b]

    answer = ResponsesAnswer("gemma3-270m", echo)
    events = asyncio.run(collect(answer))
    for event in events:
        EVENTS.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["error"]["message"] == "the model failed"
    output = last["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"]
    assert output[0]["status"] == "completed" and output[1]["status"] == "incomplete"
    assert output[1]["arguments"] == '{"city": "Par'
    tail = [json.loads(b.split(b"\ndata: ", 1)[1])
            for b in answer.failed(ApiError(500, "boom", type="server_error")).split(b"\n\n") if b]
    assert [e["type"] for e in tail] == ["error", "response.failed"]
    assert tail[0]["sequence_number"] == last["sequence_number"] + 1
    for event in tail:
        EVENTS.validate_python(event)
    assert last["response"]["usage"] is None  # nothing ended: no figures
