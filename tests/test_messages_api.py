"""Anthropic's Messages API on `localspec serve`, for real: the command in a subprocess on loopback, the embedded
model, and the official `anthropic` client, which sees only what a user of it would (serve/messages_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.test_serve import KEY, Server, start

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
SEA = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY: dict[str, Any] = {"temperature": 0}  # the SDK no longer has the argument; the API still takes it


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """Two sequences, a key (the SDK sends it as x-api-key), small answers."""
    yield from start("--parallel", "2", "--ctx", "2048", "-n", "32", "--api-key", KEY)


def client(server: Server, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key=key, max_retries=0, timeout=120)


def test_a_message_has_text_a_stop_reason_and_usage(server: Server) -> None:
    message = client(server).messages.create(
        model="default", max_tokens=16, messages=SEA, extra_body=GREEDY,
        system=[{"type": "text", "text": "You are brief."}, {"type": "text", "text": "Answer in English."}])
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 16
    assert "predicted_n" in (message.model_extra or {})["timings"]  # localspec's figures, beside usage


def test_a_prediction_is_taken_as_an_extension_and_drafted_from(server: Server) -> None:
    first = client(server).messages.create(model="default", max_tokens=16, messages=SEA, extra_body=GREEDY)
    text = first.content[0].text
    again = client(server).messages.create(model="default", max_tokens=16, messages=SEA, extra_body={
        **GREEDY, "prediction": {"type": "content", "content": text}})
    assert again.content[0].text.strip()
    timings = (again.model_extra or {})["timings"]
    assert timings["draft_n_prediction_accepted"] > 0
    with pytest.raises(anthropic.BadRequestError) as bad:
        client(server).messages.create(model="default", max_tokens=16, messages=SEA,
                                       extra_body={"prediction": {"type": "file", "content": text}})
    assert "prediction.type" in str(bad.value)


def test_a_stream_is_the_text_in_pieces_and_the_final_message(server: Server) -> None:
    with client(server).messages.stream(model="default", max_tokens=24, messages=SEA, extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == final.content[0].text and final.content[0].text.strip()
    assert final.stop_reason in ("end_turn", "max_tokens")
    # the prompt's size comes in message_delta, at the end (message_start is sent before it is known)
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0


def test_a_stop_sequence_ends_the_text_before_it(server: Server) -> None:
    message = client(server).messages.create(model="default", max_tokens=32, messages=SEA, extra_body=GREEDY,
                                             stop_sequences=["."])
    text = message.content[0].text if message.content else ""
    # which sequence matched is not told apart from the turn's end yet (the pieces say "stop" for both)
    assert "." not in text and message.stop_reason in ("end_turn", "stop_sequence"), message


def test_a_tool_loop_any_tool_then_its_result(server: Server) -> None:
    api = client(server)
    first = api.messages.create(model="default", max_tokens=60, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "any"}, extra_body=GREEDY)
    calls = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and calls, first
    call = calls[0]
    assert call.name == "get_weather" and call.id
    assert isinstance(call.input["city"], str) and call.input.get("unit", "celsius") in ("celsius", "fahrenheit")
    assert set(call.input) <= {"city", "unit"}
    # the assistant's turn as the SDK sends it back, then the result (and the error flag) in the user's turn
    turn = [*ASK, first.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "18 degrees, clear"}]}]}]
    then = api.messages.create(model="default", max_tokens=24, messages=turn, tools=[WEATHER], extra_body=GREEDY)
    assert then.content and all(block.type in ("text", "tool_use") for block in then.content), then
    assert (then.stop_reason == "tool_use") == any(block.type == "tool_use" for block in then.content), then
    # the call and its result went into the prompt
    assert then.usage.input_tokens + (then.usage.cache_read_input_tokens or 0) > \
        first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)


def test_a_streamed_tool_call_is_its_input_in_json_pieces(server: Server) -> None:
    with client(server).messages.stream(model="default", max_tokens=60, messages=ASK, tools=[WEATHER],
                                        tool_choice={"type": "tool", "name": "get_weather",
                                                     "disable_parallel_tool_use": True},
                                        extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"
             and e.delta.type == "input_json_delta"]
    assert len(starts) == 1 and starts[0].content_block.name == "get_weather" and len(parts) > 1
    (call,) = [block for block in final.content if block.type == "tool_use"]
    assert json.loads("".join(parts)) == call.input and isinstance(call.input["city"], str)
    assert call.id == starts[0].content_block.id and final.stop_reason == "tool_use"
    assert [e.type for e in events][-2:] == ["message_delta", "message_stop"]


def test_count_tokens_counts_the_prompt(server: Server) -> None:
    api = client(server)
    short = api.messages.count_tokens(model="default", messages=SEA)
    longer = api.messages.count_tokens(model="default", messages=SEA,
                                       system="You are a poet who writes about the ocean, the tides and the wind.")
    with_tools = api.messages.count_tokens(model="default", messages=SEA, tools=[WEATHER])
    assert 0 < short.input_tokens < longer.input_tokens and short.input_tokens < with_tools.input_tokens


def test_a_missing_max_tokens_is_a_400_in_anthropics_shape(server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(model="default", max_tokens=anthropic.omit, messages=SEA)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]


def test_the_key_goes_as_x_api_key_and_a_wrong_one_is_a_401(server: Server) -> None:
    assert client(server).messages.create(model="default", max_tokens=1, messages=SEA).usage.output_tokens == 1
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(server, "wrong-key").messages.create(model="default", max_tokens=8, messages=SEA)
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "authentication_error"


def test_five_stop_sequences_are_a_400_naming_the_field(server: Server) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(model="default", max_tokens=8, messages=SEA,
                                       stop_sequences=["a", "b", "c", "d", "e"])
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert "stop_sequences" in message and "4" in message


@pytest.mark.parametrize(("fields", "named"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "image"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
    ({"messages": [*SEA, {"role": "assistant", "content": "The sea"}]}, "prefill"),
    ({"tool_choice": {"type": "tool", "name": "nowhere"}, "tools": [WEATHER]}, "tool_choice"),
])
def test_what_cannot_be_done_is_a_400_that_says_so(server: Server, fields: dict[str, Any], named: str) -> None:
    body: dict[str, Any] = {"model": "default", "max_tokens": 8, "messages": SEA, **fields}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(**body)
    assert named in caught.value.body["error"]["message"]  # type: ignore[index]


def _agent_tools(n: int, words: int) -> list[dict[str, Any]]:
    """A coding agent's tools: ``n`` of them, each described in ``words`` words, with a few parameters."""
    description = " ".join(["Reads, edits or runs what the user's task needs, and says what it did."] * (words // 14))
    return [{"name": f"tool_{i}", "description": description, "input_schema": {
        "type": "object", "properties": {"path": {"type": "string", "description": "A file path."},
                                         "limit": {"type": "integer"}, "flags": {"type": "array",
                                                                                 "items": {"type": "string"}}},
        "required": ["path"]}} for i in range(n)]


def test_a_coding_agent_request_fits_or_names_the_limit_and_its_option(server: Server) -> None:
    """Claude Code-style traffic: dozens of tools and a system prompt of thousands of tokens. Within the limits it
    is counted as any other, and counted past the context too (a client counts to learn whether it fits); generated
    past the server's context, the error names --ctx; past the tools list's size, the size."""
    api = client(server)
    tools = _agent_tools(40, 28)  # ~20 KiB of tools
    fits = api.messages.count_tokens(model="default", messages=SEA, tools=tools)  # type: ignore[arg-type]
    assert fits.input_tokens > 40 * 28
    # ~90 KiB: past a schema's 64 KiB, within the 256 KiB a tools list may have; counted past the context (2048)
    assert api.messages.count_tokens(model="default", messages=SEA,
                                     tools=_agent_tools(60, 280)).input_tokens > 60 * 280  # type: ignore[arg-type]
    system = "Follow the repository's conventions and explain each change. " * 400  # ~4,000 tokens
    with pytest.raises(anthropic.BadRequestError) as caught:
        api.messages.create(model="default", max_tokens=8, system=system, messages=SEA, tools=tools)  # type: ignore[arg-type]
    assert "--ctx" in caught.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as caught:
        api.messages.count_tokens(model="default", messages=SEA, tools=_agent_tools(120, 600))  # type: ignore[arg-type]
    message = caught.value.body["error"]["message"]  # type: ignore[index]
    assert "tools" in message and "262,144 bytes" in message, message
