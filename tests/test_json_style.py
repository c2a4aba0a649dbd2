"""JSON as the model would write it, and numbers it cannot run on: the prompt's separators read (pure), carried
into the compiled grammar, overridden by a schema's own x-guidance, followed by tool calls and their check; number
leaves bounded to 16 integer and 10 fraction digits. The real model and llguidance, no mocks."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.runtime import Runtime
from localspec.schema import ConstraintSpec
from localspec.schema.json_style import COMPACT, DEFAULT, SPACED, json_options, separators_of
from localspec.schema.numbers import FRACTION_STEP, INTEGER_BOUND, bounded
from localspec.schema.spec import follow_prompt
from localspec.settings import HistorySettings, RuntimeSettings, Settings, SpeculationSettings

# -- the prompt's separators, without a model --


@pytest.mark.parametrize(("texts", "expected"), [
    (['JSON: {"name":"Anna","age":34,"tags":["a","b"]}'], COMPACT),
    (['JSON: {"name": "Anna", "age": 34, "tags": ["a", "b"]}'], SPACED),
    (["Write a haiku about the sea, then stop: no JSON here, key: value."], DEFAULT),
    ([""], DEFAULT),
    # pretty-printed: its key separator decides, and the items follow it (no free whitespace to copy)
    (['config = {\n  "host": "a",\n  "port": 80\n}'], SPACED),
    # only the JSON that parses counts: prose commas and colons do not vote against the example
    (['Note: a, b, c. Time: 10:30.\n{"a":1,"b":2}'], COMPACT),
    # each separator by its own majority: compact keys, spaced items
    (['{"a":1, "b":2, "c":[1, 2]}'], (", ", ":")),
    # several messages: the majority over all of them
    (['{"a": 1, "b": 2}', '{"c":3}', '{"d": 4, "e": 5}'], SPACED),
])
def test_the_separators_follow_the_prompts_json(texts: list[str], expected: tuple[str, str]) -> None:
    assert separators_of(texts) == expected


def test_reading_a_huge_or_hostile_prompt_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded by what it reads, not by a clock: at most _MAX_TRIES parses, each of at most _MAX_CHARS (and one
    newline) of text, however long and however hostile the prompt."""
    from localspec.schema import json_style

    reads: list[int] = []

    class Counting(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> tuple[object, int]:
            reads.append(len(s) - idx)
            return super().raw_decode(s, idx)

    monkeypatch.setattr(json_style.json, "JSONDecoder", Counting)
    hostile = "[" * 200_000 + '{"a":1}' + "{" * 200_000  # every opener starts a parse that reads to the end
    separators_of([hostile, "x" * 4_000_000])
    assert 0 < len(reads) <= json_style._MAX_TRIES
    assert max(reads) <= json_style._MAX_CHARS + 1


def test_the_choice_rides_in_the_spec_and_compiles_its_own_grammar() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}
    base = ConstraintSpec.json_schema(schema)
    spaced = follow_prompt(base, ['{"x": 1, "y": 2}'])
    compact = follow_prompt(base, ['{"x":1,"y":2}'])
    assert spaced is not None and compact is not None
    assert (spaced.separators, compact.separators) == (SPACED, COMPACT)
    assert spaced != compact and hash(spaced) != hash(compact)
    assert spaced.grammar() != compact.grammar()
    # a grammar or a regex says its own spacing; no constraint stays none
    grammar = ConstraintSpec("grammar", 'start: "yes" | "no"')
    assert follow_prompt(grammar, ['{"x":1}']) is grammar and follow_prompt(None, ['{"x":1}']) is None
    assert json_options(COMPACT) == {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


# -- number bounds, without a model --


def test_number_leaves_get_what_their_schema_leaves_open() -> None:
    own = {"type": "integer", "minimum": 0, "maximum": 130}
    assert bounded(own) == own  # bounded by the schema itself: as it is
    assert bounded({"type": "integer"}) == {"type": "integer", "minimum": -INTEGER_BOUND, "maximum": INTEGER_BOUND}
    capped = bounded({"type": "number", "maximum": 5})
    assert capped == {"type": "number", "maximum": 5, "minimum": -INTEGER_BOUND, "multipleOf": FRACTION_STEP}
    assert bounded({"type": "number", "exclusiveMinimum": 0})["exclusiveMinimum"] == 0
    assert "minimum" not in bounded({"type": "number", "exclusiveMinimum": 0})
    assert "maximum" not in bounded({"type": "integer", "minimum": 10**20})  # never an empty range
    assert bounded({"type": "number", "multipleOf": 0.5})["multipleOf"] == 0.5
    nested = bounded({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"}},
                                                       "n": {"anyOf": [{"type": ["integer", "null"]}]},
                                                       "x": {"not": {"type": "number"}}},
                      "$defs": {"d": {"type": "number"}}, "const_like": {"enum": [1, 2]}})
    assert nested["properties"]["xs"]["items"]["multipleOf"] == FRACTION_STEP
    assert nested["properties"]["n"]["anyOf"][0]["maximum"] == INTEGER_BOUND
    assert nested["properties"]["x"]["not"] == {"type": "number"}  # a bound under not would widen the schema
    assert nested["$defs"]["d"]["minimum"] == -INTEGER_BOUND


# -- the real model --


@pytest.fixture(scope="module")
def rt(model_path: Path) -> Iterator[Runtime]:
    runtime = Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="none"),
                                    history=HistorySettings("off")))
    yield runtime
    runtime.close()


def takes(rt: Runtime, spec: ConstraintSpec, text: str) -> bool:
    """Whether the grammar takes ``text`` token by token (a prefix: it need not be complete)."""
    matcher = rt.generator.grammars.start(spec).matcher
    return bool(matcher.consume_tokens(rt.model.vocab.tokenize(text, add_special=False, parse_special=False)))


def test_a_number_cannot_take_a_17th_integer_digit_or_an_11th_fraction_digit(rt: Runtime) -> None:
    free = ConstraintSpec.json_schema({"type": "object", "properties": {"n": {"type": "number"}}}, separators=COMPACT)
    assert takes(rt, free, '{"n":' + "1" * 16) and not takes(rt, free, '{"n":' + "1" * 17)
    assert takes(rt, free, '{"n":-' + "8" * 16) and not takes(rt, free, '{"n":-' + "8" * 17)
    assert takes(rt, free, '{"n":0.' + "3" * 10) and not takes(rt, free, '{"n":0.' + "3" * 11)
    assert takes(rt, free, '{"n":120.5}') and takes(rt, free, '{"n":-0.25}')
    anything = ConstraintSpec("json_object", separators=COMPACT)  # json_object's values, however deep
    assert takes(rt, anything, '{"a":[{"b":' + "1" * 16) and not takes(rt, anything, '{"a":[{"b":' + "1" * 17)
    assert takes(rt, anything, '{"a":null,"b":true,"c":"x","d":[1.5]}')
    # a schema's own bounds stand: 0..130 takes 130, not 131
    age = ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                              "maximum": 130}}}, separators=COMPACT)
    assert takes(rt, age, '{"a":130}') and not takes(rt, age, '{"a":131}')


def test_a_model_that_copies_a_long_number_stops_at_16_digits(model_path: Path) -> None:
    from localspec import generate

    schema = {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"],
              "additionalProperties": False}
    prompt = 'Copy the number.\nJSON: {"n": ' + "1" + "0" * 40 + '}\nJSON: '
    result = generate({"prompt": prompt, "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": schema}}}, model=str(model_path), drafter="ngram", max_tokens=64, ctx=1024,
        keep_history=False)
    assert result.finish_reason == "stop", result.text
    digits = re.search(r"-?[0-9]+", result.text)
    assert digits is not None and len(digits.group().lstrip("-")) <= 16 and json.loads(result.text)["n"]


INVOICE = {"type": "object", "properties": {"vendor": {"type": "string", "maxLength": 24},
           "total": {"type": "number", "minimum": 0, "maximum": 100000}, "currency": {"enum": ["EUR", "USD", "GBP"]},
           "lines": {"type": "integer", "minimum": 1, "maximum": 99}},
           "required": ["vendor", "total", "currency", "lines"], "additionalProperties": False}
EXAMPLE = {"vendor": "ACME GmbH", "total": 120.5, "currency": "EUR", "lines": 3}


def extraction(separators: tuple[str, str]) -> str:
    return ("Extract the fields as JSON.\nText: Invoice from ACME GmbH, 3 lines, total 120.50 EUR.\nJSON: "
            f"{json.dumps(EXAMPLE, separators=separators)}\nText: Globex Ltd invoiced 4500 GBP for 2 lines.\nJSON: ")


def test_the_answer_is_spaced_as_the_prompts_example_and_x_guidance_overrides_it(model_path: Path) -> None:
    from localspec import generate_many

    def row(id: str, prompt: str, schema: dict) -> dict:
        return {"id": id, "prompt": prompt, "max_tokens": 48, "response_format": {
            "type": "json_schema", "json_schema": {"name": "invoice", "schema": schema}}}

    compact_by_request = {"x-guidance": {"item_separator": ",", "key_separator": ":"}, **INVOICE}
    results = {r.id: r for r in generate_many(
        [row("spaced", extraction(SPACED), INVOICE), row("compact", extraction(COMPACT), INVOICE),
         row("override", extraction(SPACED), compact_by_request)],
        model=str(model_path), drafter="ngram", ctx=1024, keep_history=False)}
    for id, result in results.items():
        assert result.finish_reason == "stop", (id, result.text)
        value = json.loads(result.text)
        assert set(value) == set(INVOICE["required"]) and value["currency"] in ("EUR", "USD", "GBP"), result.text
        assert isinstance(value["total"], (int, float)) and isinstance(value["lines"], int)
    assert results["spaced"].text == json.dumps(json.loads(results["spaced"].text))  # json.dumps' own spacing
    for id in ("compact", "override"):
        text = results[id].text
        assert text == json.dumps(json.loads(text), separators=COMPACT), (id, text)


def test_a_schemas_own_x_guidance_goes_over_the_prompts_choice(rt: Runtime) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
              "items": {"type": "integer"}}}, "required": ["a", "b"]}
    spaced = ConstraintSpec.json_schema(schema, separators=SPACED)
    assert takes(rt, spaced, '{"a": 1, "b": [1, 2]}') and not takes(rt, spaced, '{"a":1')
    assert not takes(rt, spaced, '{"a":  1')  # bounded: the separator's one space, no more
    free = {"whitespace_flexible": True, "item_separator": "\\s*,\\s*", "key_separator": "\\s*:\\s*"}
    loose = ConstraintSpec.json_schema({"x-guidance": free, **schema}, separators=SPACED)
    for text in ('{"a": 1, "b": [1, 2]}', '{"a":1,"b":[1,2]}', '{ "a" : 1 ,\n  "b": [ 1,2 ] }'):
        assert takes(rt, loose, text), text


# -- tool calls follow the same choice --

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]},
                                                           "days": {"type": "integer"}},
                          "required": ["city", "unit"]}}}


def test_tool_instructions_grammar_and_check_follow_the_conversations_json(rt: Runtime) -> None:
    from localspec.engine.chat import Message
    from localspec.structured.tool_prompt import tool_calls
    from localspec.structured.tools import read_tools

    use = read_tools([WEATHER], "required", False)
    assert use is not None
    for separators in (SPACED, COMPACT):
        asked = f"My last trip, as JSON: {json.dumps({'city': 'Oslo', 'days': 3}, separators=separators)}. " \
                "What is the weather in Rome?"
        tokens, spec = rt.tool_prompt([Message("user", asked)], use)
        shown = b"".join(rt.model.vocab.piece(t) for t in tokens).decode()
        item, key = separators
        assert f'{{"name"{key}<the tool\'s name>{item}"arguments"{key}<its arguments>}}' in shown
        assert f'"name"{key}"get_weather"{item}"description"' in shown
        assert json.dumps(json_options(separators)) in spec.text
        call = json.dumps({"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}, separators=separators)
        other = json.dumps({"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}},
                           separators=COMPACT if separators == SPACED else SPACED)
        assert takes(rt, spec, call) and not takes(rt, spec, other)
        found = tool_calls(rt.generator.grammars, call, use)
        assert found.calls and json.loads(found.calls[0]["function"]["arguments"]) == {"city": "Rome", "unit": "c"}
        bad = json.dumps({"name": "get_weather", "arguments": {"city": "Rome", "unit": "k"}}, separators=separators)
        assert tool_calls(rt.generator.grammars, bad, use).calls == ()


def test_the_check_accepts_valid_arguments_in_either_style_and_refuses_bad_ones_without_raising(rt: Runtime) -> None:
    grammars = rt.generator.grammars
    params = WEATHER["function"]["parameters"]
    for separators in (SPACED, COMPACT):
        assert grammars.matches(params, {"unit": "f", "city": "Lima", "days": 2}, separators)  # any key order
        assert not grammars.matches(params, {"city": "Lima", "unit": "kelvin"}, separators)
        assert not grammars.matches(params, {"city": "Lima"}, separators)  # a required key missing
        # a number past the bound a grammar writes under is valid: the schema as written does not bound it (a call
        # written without a grammar was dropped as text before b5e6d65)
        assert grammars.matches(params, {"city": "Lima", "unit": "c", "days": 10**17}, separators)
        assert not grammars.matches(params, {"city": "\ud800", "unit": "c"}, separators)  # no UTF-8: False
