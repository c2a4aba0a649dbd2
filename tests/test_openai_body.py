"""The one reader of OpenAI request bodies (localspec/openai_body.py): `localspec batch` and `localspec serve` take
every body alike (issue #27: batch ignored max_completion_tokens, dropped n, logprobs, echo and image parts, and
refused the developer role, where serve answered otherwise), what localspec cannot do is refused naming the field,
and text that is not valid Unicode is bad input, not a crash. No model: the layer is plain Python."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localspec.batch.files import LineError, parse_line
from localspec.engine.chat import Message
from localspec.errors import UserError
from localspec.openai_body import BodyError, parse_body
from localspec.request import Request
from localspec.serve.protocol import ApiError, parse

USER = [{"role": "user", "content": "Hi"}]
URLS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}

BODIES: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"messages": USER, "max_completion_tokens": 5}),
    ("chat", {"messages": USER, "max_tokens": 9, "max_completion_tokens": 5}),
    ("chat", {"messages": [{"role": "developer", "content": "Be brief."}, *USER]}),
    ("chat", {"messages": [{"role": "assistant", "content": None}, *USER]}),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                       "text": "b"}]}]}),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("chat", {"messages": [{"role": "tool", "content": "42"}]}),
    ("chat", {"messages": USER, "n": 2}),
    ("chat", {"messages": USER, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
              "tools": [], "tool_choice": "none", "response_format": {"type": "text"}}),
    ("chat", {"messages": USER, "logprobs": True}),
    ("chat", {"messages": USER, "top_logprobs": 2}),
    ("chat", {"messages": USER, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 4,
              "stop": ["x"], "speculation": {"drafter": "ngram", "k": 3}}),
    ("chat", {"messages": USER, "temperature": "hot"}),
    ("completion", {"prompt": "1, 2,", "echo": True}),
    ("completion", {"prompt": "1, 2,", "logprobs": 2}),
    ("completion", {"prompt": "1, 2,", "suffix": "end"}),
    ("completion", {"prompt": "1, 2,", "best_of": 3}),
    ("completion", {"prompt": ["1, 2,"], "stop": "\n", "max_tokens": 3}),
    ("completion", {"prompt": ["a", "b"]}),
    ("completion", {"prompt": "p", "stop": ["a", "b", "c", "d", "e"]}),
    ("completion", {"prompt": "p", "speculation": {"drafter": "draft"}}),
]


def _batch(kind: str, body: dict[str, Any]) -> Request | tuple[str | None, str]:
    line = json.dumps({"custom_id": "r", "method": "POST", "url": URLS[kind], "body": body})
    got = parse_line(line, 1)
    if isinstance(got, LineError):
        return (None, got.message.removeprefix("line 1: "))
    return got


def _serve(kind: str, body: dict[str, Any]) -> Request | tuple[str | None, str]:
    try:
        return parse(kind, body).request  # type: ignore[arg-type]
    except ApiError as e:
        return (None, e.message)


@pytest.mark.parametrize(("kind", "body"), BODIES)
def test_batch_and_serve_read_every_body_alike(kind: str, body: dict[str, Any]) -> None:
    batch, serve = _batch(kind, body), _serve(kind, body)
    if isinstance(batch, Request) and isinstance(serve, Request):
        fields = ("prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                  "drafter", "k")
        assert {f: getattr(batch, f) for f in fields} == {f: getattr(serve, f) for f in fields}
    else:
        assert batch == serve


def test_what_the_two_now_agree_on() -> None:
    got = _batch(*BODIES[1])
    assert isinstance(got, Request) and got.max_tokens == 5  # max_completion_tokens wins, as OpenAI's does
    got = _batch(*BODIES[2])
    assert isinstance(got, Request) and got.messages == (Message("system", "Be brief."), Message("user", "Hi"))
    for refused in (5, 7, 9, 13, 14):
        assert not isinstance(_batch(*BODIES[refused]), Request), BODIES[refused]


@pytest.mark.parametrize(("field", "value"), [
    ("tools", {"type": "function", "function": {"name": "f"}}),  # one tool, not a list
    ("tool_choice", "required"),  # with no tools to call
    ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
    ("response_format", "json"),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -1),
    ("logit_bias", {"42": 100}),
    ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]),
    ("n", 2),
    ("n", True),
])
def test_what_localspec_cannot_do_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(BodyError) as got:
        parse_body({"messages": USER, field: value}, "chat", "r")
    assert got.value.param == field and field in str(got.value)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "a\ud800b"}, "prompt"),
    ({"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udfff"}]}, "messages.1.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]}, "messages.0.content"),
    ({"prompt": "p", "stop": ["ok", "\ud800"]}, "stop"),
])
def test_a_lone_surrogate_is_bad_input_naming_its_field(body: dict[str, Any], param: str) -> None:
    # json.loads turns the escape "\ud800" into a lone surrogate, which no tokenizer and no UTF-8 file can take
    with pytest.raises(BodyError) as got:
        parse_body(json.loads(json.dumps(body)), None, "r")
    assert got.value.param == param and "lone surrogate" in str(got.value)
    line = parse_line(json.dumps({"id": "x", **body}), 4)  # batch: an error record under its id
    assert isinstance(line, LineError) and line.id == "x" and "lone surrogate" in line.message
    json.dumps(line.message, ensure_ascii=False).encode("utf-8")  # the record itself can be written


def test_an_id_that_is_a_lone_surrogate_or_null_is_named_by_its_line() -> None:
    bad = parse_line('{"id": "a\\ud800", "prompt": "p"}', 3)
    assert isinstance(bad, LineError) and bad.id == "line-3" and "id" in bad.message
    assert parse_line('{"id": null, "prompt": "p"}', 5) == Request("line-5", prompt="p", line=5)


def test_the_python_api_raises_a_user_error_for_a_lone_surrogate() -> None:
    from localspec.batch.api import as_request

    with pytest.raises(UserError, match="lone surrogate"):
        as_request("a\ud800b", 0)
    with pytest.raises(UserError, match="prompt 'q'.*lone surrogate"):
        as_request({"id": "q", "messages": [{"role": "user", "content": "\ud800"}]}, 0)


def test_a_body_nested_too_deeply_is_bad_json_not_a_crash() -> None:
    got = parse_line("[" * 100_000 + "]" * 100_000, 2)
    assert isinstance(got, LineError) and got.id == "line-2" and "nested too deeply" in got.message


def test_the_drafters_a_body_may_ask_for_are_those_that_need_no_model() -> None:
    # one list (settings.MODEL_FREE_DRAFTERS) for the body reader and the replay: each drafter on it is built
    # without a model, and every other one needs one
    from localspec.opening import lookup_drafters
    from localspec.settings import DRAFTERS as ALL
    from localspec.settings import MODEL_FREE_DRAFTERS as DRAFTERS

    assert set(DRAFTERS) < set(ALL)
    assert {d for d in ALL if lookup_drafters(d) is not None} == set(DRAFTERS)


DEEP = "[" * 5000 + "]" * 5000  # the reproduced case: an earlier call's arguments, past Python's recursion limit


def test_nesting_past_the_bound_is_bad_input_naming_its_field_wherever_it_is() -> None:
    """Nested arguments of an earlier call, a nested body, a nested mapping given to the Python API: each one line
    naming its place, never a RecursionError (localspec/bounded_json.py)."""
    from localspec.batch.api import as_request
    from localspec.bounded_json import DEPTH_MAX, loads, loads_or_none

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": DEEP}}
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                            "tool_calls": [call]}]}
    with pytest.raises(BodyError, match="deeper than") as e:
        parse_body(body, "chat", "a")
    assert e.value.param == "messages.1.tool_calls.0.function.arguments"
    line = parse_line(json.dumps({"id": "deep", **body}), 2)
    assert isinstance(line, LineError) and line.id == "deep" and "arguments" in line.message
    with pytest.raises(ValueError, match=f"deeper than {DEPTH_MAX}"):
        loads("[" * (DEPTH_MAX + 1) + "]" * (DEPTH_MAX + 1))
    assert loads("[" * DEPTH_MAX + "]" * DEPTH_MAX) is not None and loads_or_none(DEEP) is None
    nested: dict[str, Any] = {"prompt": "x", "metadata": {}}
    for _ in range(DEPTH_MAX + 5):
        nested["metadata"] = {"m": nested["metadata"]}
    with pytest.raises(UserError, match="prompt '0' nests deeper"):
        as_request(nested, 0)
    with pytest.raises(ApiError) as api_error:
        parse("chat", body)
    assert api_error.value.status == 400 and api_error.value.param == "messages.1.tool_calls.0.function.arguments"


def test_every_way_an_answer_ends_has_one_name_in_each_face() -> None:
    """One table (localspec/finish_reasons.py): the loop's reasons as results say them, and OpenAI's words for
    those, which every serve face and OpenAI Batch output use; a grammar's dead end is no word OpenAI's clients
    know."""
    from localspec.finish_reasons import RESULT, openai_reason, result_reason

    loop = ("eog", "stop", "length", "context_full", "interrupted", "dead_end")
    assert {result_reason(r) for r in loop} <= set(RESULT.values())
    assert {openai_reason(r) for r in [*loop, *RESULT.values()]} == {"stop", "length", "tool_calls"}
    assert openai_reason("dead_end") == "stop" and openai_reason("context_full") == "length"
