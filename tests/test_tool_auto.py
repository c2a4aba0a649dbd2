"""`tool_choice: "auto"` an agent can rely on: a call starts the grammar where the model writes one in its own habit
(the template's marker, or a call's JSON naming a tool at the answer's start), an opener closes with its own closer,
and JSON the user asked for stays text (structured/call_shapes.py, structured/tools.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import localspec as api
from localspec.schema.defaults import with_defaults
from localspec.structured.call_watch import CallWatch
from localspec.structured.grammars import Grammars
from localspec.structured.tool_prompt import tool_calls
from localspec.structured.tools import read_calls, read_tools
from tests.lossless import checking_model

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
CURRENCY = {"type": "function", "function": {"name": "convert_currency", "parameters": {
    "type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                     "to": {"type": "string"}}, "required": ["amount", "from", "to"]}}}
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
JSON_EXAMPLES = [
    "Show me an example JSON config for a web server with host and port, in a ```json block.",
    "Write a JSON example of a user record with name and email, in a fenced json code block.",
]


def ok(name: str, arguments: dict) -> bool:
    return arguments.get("unit") in ("celsius", "fahrenheit") and isinstance(arguments.get("city"), str)


def test_only_json_alone_is_read_as_a_call_and_an_example_in_prose_stays_text() -> None:
    use = read_tools([WEATHER], "auto", None)
    assert read_calls(CALL, use, ok).calls and read_calls(f"```json\n{CALL}\n```", use, ok).calls
    example = f"Here is an example:\n```json\n{CALL}\n```\nUse it as a template."
    assert read_calls(example, use, ok).calls == () and read_calls(example, use, ok).content == example
    config = '```json\n{"host": "0.0.0.0", "port": 8080}\n```'  # alone, but it names no tool
    assert read_calls(config, use, ok).calls == ()
    # the call shape itself, naming a tool the request does not offer: text, in every shape
    unknown = CALL.replace("get_weather", "get_time")
    for text in (unknown, "{" + unknown + "}", f"```json\n{unknown}\n```", f"<tool_call>\n{unknown}\n</tool_call>"):
        calls = read_calls(text, use, ok)
        assert calls.calls == () and calls.content == text, text
    # either closer is read: a call opened with the marker and shut with a fence is still the call
    assert read_calls(f"<tool_call>\n{CALL}\n```", use, ok).calls
    # the doubled braces of the Qwen2.5-Coder GGUF's template example are its call too
    assert read_calls("{" + CALL + "}", use, ok).calls and read_calls("```json\n{" + CALL + "}\n```", use, ok).calls


def _held(use, text: str) -> str:  # noqa: ANN001
    """What a stream has sent of ``text`` so far, fed as it came."""
    watch = CallWatch(use)
    return "".join(getattr(p, "text", "") for p in watch.feed(text))


def test_a_stream_holds_back_only_what_may_still_become_a_call() -> None:
    use = read_tools([WEATHER], "auto", None)
    for maybe in ("```json\n{", "  {", '{"na', '```json\n{{"name": "get_we', "I will call <tool"):
        assert not _held(use, maybe).endswith(maybe.strip()[-3:]), maybe
    # a fence that names another language, JSON that names no tool, prose: never a call, sent as written
    for text in ("```python\ndef f():\n", '{"host": "0.0.0.0"', "Here is an example:\n```json\n{", '{"name": "x"'):
        assert _held(use, text) == text, text


def test_auto_waits_for_a_call_in_the_model_own_habit() -> None:
    use = read_tools([WEATHER], "auto", None)
    spec = use.constraint("json", None, None)
    assert '^{"name": "get_weather"' in spec.triggers and '^{{"name": "get_weather"' in spec.triggers
    assert '^```json\n{"name": "get_weather"' in spec.triggers and "<tool_call>" not in spec.triggers
    spec = use.constraint("hermes", 151657, 151658)
    assert spec.triggers[0] == "<[151657]>" and '^{{"name": "get_weather"' in spec.triggers
    required = read_tools([WEATHER], "required", None).constraint("json", None, None)
    assert required is not None and required.triggers == ()


@pytest.fixture(scope="module")
def grammars(model_path: Path) -> Grammars:
    return Grammars(checking_model(model_path).vocab)


def _takes(grammars: Grammars, spec, text: str) -> bool:  # noqa: ANN001
    matcher = grammars.start(spec).matcher
    tokens = grammars.vocab.tokenize(text, add_special=False, parse_special=False)
    return bool(matcher.consume_tokens(tokens)) and not matcher.is_error() and bool(matcher.is_accepting())


def test_a_call_opened_with_the_marker_closes_only_with_its_own_closer(grammars: Grammars) -> None:
    # the marker as text (a vocabulary without it as one token): the grammar is fed from the marker on
    spec = read_tools([WEATHER], "auto", None).constraint("hermes", None, None)
    assert spec.triggers[0] == "<tool_call>"
    # the call as the grammar spaces it (compact, or json.dumps' separators): whichever it is, only the closer ends it
    calls = [CALL, CALL.replace(": ", ":").replace(", ", ",")]
    assert any(_takes(grammars, spec, f"<tool_call>\n{call}\n</tool_call>") for call in calls)
    assert not any(_takes(grammars, spec, f"<tool_call>\n{call}\n```") for call in calls)
    # after the last call only one newline (or another call): never free whitespace to run on in
    assert _takes(grammars, spec, f"<tool_call>\n{CALL}\n</tool_call>\n")
    assert not _takes(grammars, spec, f"<tool_call>\n{CALL}\n</tool_call>\n ")


@pytest.mark.parametrize("text", ["{" + CALL + "}", f"```json\n{CALL}\n```", f"  [{CALL}, {CALL}]", CALL],
                         ids=["doubled", "fenced", "list", "bare"])
def test_the_grammar_takes_each_shape_a_call_starts_in(grammars: Grammars, text: str) -> None:
    for style in ("json", "hermes"):
        spec = read_tools([WEATHER], "auto", None).constraint(style, None, None)
        assert _takes(grammars, spec, text), (style, text)
        assert not _takes(grammars, spec, text + "\nThat is the call."), (style, text)


def test_a_json_example_asked_of_the_embedded_model_comes_back_as_text(model_path: Path) -> None:
    asks = [{"id": str(i), "messages": [{"role": "user", "content": prompt}], "tools": [WEATHER, CURRENCY],
             "tool_choice": "auto", "max_tokens": 64} for i, prompt in enumerate(JSON_EXAMPLES)]
    for r in api.generate_many(asks, drafter="ngram", keep_history=False, parallel=2, ctx=1024):
        assert r.error is None and not r.tool_calls and r.finish_reason != "tool_calls", r
        assert r.text.strip()


# -- the validator serve, batch and the API use (structured/tool_prompt.py: Grammars.matches under the tool's schema)


@pytest.mark.parametrize(("arguments", "valid"), [
    ({"city": "Oslo", "unit": "celsius"}, True),
    ({"unit": "fahrenheit", "city": "Oslo"}, True),  # properties in another order
    ({"city": "Oslo", "unit": "kelvin"}, False),  # not in the enum
    ({"city": "Oslo"}, False),  # a required property missing
    ({"city": 7, "unit": "celsius"}, False),  # another type
    ({"city": "Oslo", "unit": "celsius", "when": "now"}, False),  # a property the tool does not take
    ({"city": "\ud800", "unit": "celsius"}, False),  # a lone surrogate: no UTF-8 can carry it
], ids=["valid", "reordered", "enum", "missing", "type", "extra", "surrogate"])
def test_the_validator_takes_valid_arguments_and_refuses_the_rest(grammars: Grammars, arguments: dict,
                                                                   valid: bool) -> None:
    use = read_tools([WEATHER, CURRENCY], "auto", None)
    assert use is not None
    for text in (json.dumps({"name": "get_weather", "arguments": arguments}),
                 "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": arguments}) + "\n</tool_call>"):
        calls = tool_calls(grammars, text, use)
        assert bool(calls.calls) is valid, (text, calls)
        if not valid:
            assert calls.content == text  # refused: the answer is text, as the model wrote it


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "convert_currency"}},
                                    "auto"], ids=["required", "named", "auto"])
def test_calls_on_the_embedded_model_are_what_the_validator_takes(model_path: Path, grammars: Grammars,
                                                                   choice: object) -> None:
    asks = [{"id": str(i), "messages": [{"role": "user", "content": q}], "tools": [WEATHER, CURRENCY],
             "tool_choice": choice, "max_tokens": 96}
            for i, q in enumerate(["What is the weather in Lisbon, in celsius?", "Convert 250 euros to yen."])]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CURRENCY)}
    for r in api.generate_many(asks, drafter="ngram", keep_history=False, parallel=2, ctx=1024):
        assert r.error is None, r
        if choice != "auto":  # a call was asked for: one came, whole
            assert r.finish_reason == "tool_calls" and r.tool_calls, r
        if choice == "auto" and not r.tool_calls:
            assert r.finish_reason != "tool_calls" and r.text, r
        for call in r.tool_calls or []:
            name = call["function"]["name"]
            assert isinstance(choice, str) or name == "convert_currency"
            # judged by jsonschema, not by the validator that filtered the calls (llguidance), under the defaults
            # the grammar writes by (an object listing its properties takes no others)
            jsonschema.validate(json.loads(call["function"]["arguments"]), with_defaults(schemas[name]))


def test_a_conversation_with_earlier_calls_and_no_tools_now_is_answered_as_text(model_path: Path) -> None:
    """An agent's last turn may offer no tools (tool_choice none, or a client that drops them): its earlier calls
    and results are written as text on a template that cannot show them, never refused."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": None,
                                                                 "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"weather": "snow"}'}]
    for ask in ({"messages": messages}, {"messages": messages, "tools": [WEATHER], "tool_choice": "none"}):
        r = api.generate({**ask, "max_tokens": 8}, drafter="ngram", keep_history=False, ctx=1024)
        assert r.error is None and r.text.strip() and r.stats.prompt_tokens > 20, r


def test_a_call_read_back_is_checked_against_its_schema_as_written_not_the_bounds_a_grammar_writes(
        grammars: Grammars) -> None:
    """A call written without a grammar (auto, before any trigger) whose number passes the bound a grammar would
    write (16 integer digits, 10 fraction digits) is still valid for its tool: the schema does not bound it."""
    use = read_tools([CURRENCY], "auto", None)
    for amount in (12345678901234567890, 0.123456789012345, 1e20):
        text = json.dumps({"name": "convert_currency", "arguments": {"amount": amount, "from": "EUR", "to": "JPY"}})
        assert tool_calls(grammars, text, use).calls, text


def test_numbers_under_open_leaves_are_bounded_in_the_grammar(grammars: Grammars) -> None:
    """A tool with no parameters, ``{}``, an open object: llguidance's own "any" leaves numbers open, and a small
    model can write digits to the end of its tokens; the grammar bounds them as it bounds typed numbers."""
    from localspec.schema.spec import ConstraintSpec

    ping = {"type": "function", "function": {"name": "ping"}}  # no parameters: any object
    spec = read_tools([ping], "required", None).constraint("json", None, None)
    assert _takes(grammars, spec, '{"name": "ping", "arguments": {"n": 12, "m": [1.5, {"k": -3}]}}')
    assert not _takes(grammars, spec, '{"name": "ping", "arguments": {"n": ' + "9" * 20 + "}}")
    schema = ConstraintSpec.json_schema({"type": "object", "properties": {"a": {}}, "required": ["a"]})
    assert _takes(grammars, schema, '{"a": 12345}') and not _takes(grammars, schema, '{"a": ' + "1" * 20 + "}")


def test_reading_calls_back_never_evicts_what_admissions_compiled(grammars: Grammars) -> None:
    """The checker's matchers (schemas as written) are kept apart from requests' (bounded by count and by an
    estimate of their memory): 70 tools' schemas checked leave a request's compiled matcher in place."""
    from localspec.schema.spec import ConstraintSpec

    request = ConstraintSpec.json_schema({"type": "object", "properties": {"kept": {"type": "string"}}})
    compiled = grammars.compile(request)
    for i in range(70):
        assert grammars.matches({"type": "object", "properties": {f"p{i}": {"type": "integer"}}}, {f"p{i}": i})
    assert grammars.compile(request) is compiled  # the same matcher: still cached, not compiled again
