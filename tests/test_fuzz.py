"""A fuzzer over every POST endpoint of `localspec serve`, with hypothesis: valid seed bodies, mutated (a value of the
wrong type at a random path, a key deleted or added, huge numbers, NaN and Infinity, very long strings, nesting
100 to 10,000 deep, lone surrogates, truncated text, invalid UTF-8, a top level that is no object, nothing at all),
sent to one real server on the embedded model. The property: never a 5xx; every 4xx in the endpoint's own error
shape; a 200 is JSON a client can read (a stream: no server error in it); and after the fuzz the server is healthy
and its log holds no traceback. The same for `localspec batch`: a file of good and bad lines gives one record a
line, and the job ends by itself.

The default size (40 bodies an endpoint) fits the suite: ~20 s on 2 cores. A larger run, for docs/hostile-inputs.md
("The fuzzer: every endpoint"; 2 min 13 s on 2 cores on 2026-12-06, hypothesis's shrinking included):

    LOCALSPEC_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/test_fuzz.py -q -p no:randomly -s

prints the bodies tried per endpoint, the 5xx seen and the tracebacks seen.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from localspec.cli import app
from tests.test_serve import Server, start

# per endpoint: derandomized, so CI tries the same bodies every run; a larger run is the same test, longer
EXAMPLES = int(os.environ.get("LOCALSPEC_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])

# what the larger run reports: bodies sent, 5xx answers, per endpoint (shrinking's replays count too)
TRIED: Counter[str] = Counter()
FIVE_XX: Counter[str] = Counter()
STATUSES: dict[str, Counter[int]] = {}
FAILED_LINES: list[str] = []  # the server log's lines that say it failed (a traceback, a 500's line)

# -- valid seeds: what real clients send, each cheap under the server's limits (max_tokens at most 2) --

SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age"], "additionalProperties": False}
PARAMETERS: dict[str, Any] = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}
FUNCTION: dict[str, Any] = {"type": "function", "function": {"name": "get_weather", "description": "The weather now",
                                                             "parameters": PARAMETERS}}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

CHAT: list[dict[str, Any]] = [
    {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0},
    {"model": "gemma3-270m", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Count: 1, 2,"}]}],
     "max_completion_tokens": 2, "stop": ["\n", "."], "stream": True, "stream_options": {"include_usage": True},
     "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7, "speculation": {"drafter": "ngram", "k": 4}},
    {"messages": [ASK], "tools": [FUNCTION], "tool_choice": "required", "parallel_tool_calls": False,
     "max_tokens": 2},
    {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C, clear"}],
     "tools": [FUNCTION], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
     "max_tokens": 2, "stream": True},
    {"messages": [{"role": "developer", "content": "JSON only."}, {"role": "user", "content": "Anna, 34:"}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
     "max_tokens": 2, "n": 1, "presence_penalty": 0, "logit_bias": {}},
    {"messages": [{"role": "user", "content": "Yes or no?"}], "response_format": {"type": "regex", "regex": "(yes|no)"},
     "max_tokens": 2, "stream": True},
    {"messages": [{"role": "user", "content": "Rename x to y: x = 1"}], "max_tokens": 2, "stream": True,
     "stream_options": {"include_usage": True}, "prediction": {"type": "content", "content": "x = 1"}},
]
COMPLETIONS: list[dict[str, Any]] = [
    {"model": "default", "prompt": "1, 2, 3,", "max_tokens": 2},
    {"prompt": ["The capital of France is"], "max_tokens": 2, "stop": "\n", "stream": True,
     "stream_options": {"include_usage": True}, "temperature": 0.7, "seed": 1, "speculation": {"drafter": "none"}},
    {"prompt": "Answer yes or no:", "max_tokens": 2, "response_format": {"type": "grammar",
                                                                        "grammar": 'start: "yes" | "no"'}},
    {"prompt": "JSON:", "max_tokens": 2, "response_format": {"type": "json_object"}, "echo": False, "best_of": 1},
    {"prompt": "a = 1\nb = 2\n", "max_tokens": 2,
     "prediction": {"type": "content", "content": [{"type": "text", "text": "c = 3\n"}]}},
]
RESPONSES: list[dict[str, Any]] = [
    {"model": "default", "input": "Hi", "max_output_tokens": 2, "temperature": 0},
    {"input": [{"type": "message", "role": "developer", "content": "Be brief."},
               {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]}],
     "instructions": "You are terse.", "max_output_tokens": 2, "stream": True, "metadata": {"run": "1"},
     "store": False, "include": [], "truncation": "disabled", "reasoning": {}, "user": "u1", "top_p": 1,
     "stop": ["\n"]},
    {"input": "Weather in Paris?", "max_output_tokens": 2, "tool_choice": "required", "parallel_tool_calls": False,
     "tools": [{"type": "function", "name": "get_weather", "description": "The weather now",
                "parameters": PARAMETERS, "strict": True}]},
    {"input": [{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "P"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}],
     "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}], "max_output_tokens": 2,
     "tool_choice": {"type": "function", "name": "get_weather"}, "stream": True},
    {"input": "Rename x to y: x = 1", "max_output_tokens": 2, "prediction": {"type": "content", "content": "y = 1"}},
    {"input": "Anna, 34, as JSON:", "max_output_tokens": 2,
     "text": {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True},
              "verbosity": "low"}},
]
MESSAGES: list[dict[str, Any]] = [
    {"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
    {"max_tokens": 2, "system": [{"type": "text", "text": "Be brief."}], "stream": True, "stop_sequences": ["."],
     "temperature": 0, "top_k": 10, "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
     "messages": [{"role": "user", "content": [{"type": "text", "text": "One sentence about the sea."}]}]},
    {"max_tokens": 2, "tools": [{"name": "get_weather", "description": "The weather now", "input_schema": PARAMETERS}],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
     "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    {"max_tokens": 2, "stream": True, "tools": [{"name": "get_weather", "input_schema": PARAMETERS}],
     "tool_choice": {"type": "tool", "name": "get_weather"},
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                    {"type": "tool_use", "id": "tu_1", "name": "get_weather",
                                                     "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "is_error": False,
                                                "content": [{"type": "text", "text": "18 C"}]},
                                               {"type": "text", "text": "And tomorrow?"}]}]},
    {"max_tokens": 2, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
     "messages": [{"role": "user", "content": "Anna, 34, as JSON:"}]},
]
COUNT: list[dict[str, Any]] = [
    {"model": "default", "messages": [{"role": "user", "content": "Hi"}]},
    {"system": "You are a poet.", "tools": [{"name": "get_weather", "input_schema": PARAMETERS}],
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "get_weather",
                                                     "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "18 C"}]}]},
]
SEEDS: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS, "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES, "/v1/messages/count_tokens": COUNT}
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")


# -- mutations --


@dataclass(frozen=True)
class Raw:
    """JSON text spliced in as it is: what Python's json cannot write (NaN as a bare word, a lone surrogate's
    escape, nesting 10,000 deep) or would write otherwise (2**70 as a float)."""

    text: str


def dump(value: Any) -> str:
    """``value`` as JSON text, ``Raw`` pieces as they are (the tree around them is a seed's: a few levels deep)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(v) for v in value) + "]"
    return json.dumps(value)


Path_ = tuple[str | int, ...]


def paths(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every place in ``value`` below the top, parents before children."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*at, key)
        yield from paths(child, (*at, key))


def containers(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every object in ``value`` (the top included): where an unknown key can go."""
    if isinstance(value, dict):
        yield at
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from containers(child, (*at, key))


def at_path(value: Any, path: Path_) -> Any:
    for key in path:
        value = value[key]
    return value


# the words the readers branch on: a random value that is one of them gets past the first check to the next
WORDS = ["default", "gemma3-270m", "user", "assistant", "system", "developer", "tool", "function", "text",
         "json_schema", "json_object", "grammar", "regex", "auto", "none", "required", "any", "message",
         "function_call", "function_call_output", "input_text", "output_text", "tool_use", "tool_result", "image",
         "thinking", "enabled", "disabled", "reasoning", "item_reference", "refusal", "custom", "object", "string",
         "integer", "array", "ngram", "call_1", "tu_1", "get_weather", "", " ", "\n", "<end_of_turn>"]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(), st.sampled_from(WORDS),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
JSON_VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.one_of(st.sampled_from(WORDS), st.text(max_size=6)), inner,
                                             max_size=3), max_leaves=6)
# numbers past what the readers expect, as JSON text: Python reads NaN and Infinity (no JSON), 1e400 as inf, and
# refuses an integer of more than 4,300 digits
NUMBERS = ["1e308", "-1e308", "1e400", "-1e400", str(2**70), str(-(2**70)), str(2**63), str(2**64 + 1), "NaN",
           "Infinity", "-Infinity", "-0", "-0.0", "5e-324", "1e-400", "0.5", "1" + "0" * 5000, "1.0", "-1"]
SURROGATES = ["\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d", "a\\ud800b", "\\ud83d\\ude00x\\udbff"]


@st.composite
def deep(draw: st.DrawFn) -> Raw:
    """Nesting 100 to 10,000 deep, as text: Python's json cannot write it (its encoder recurses)."""
    depth = draw(st.one_of(st.integers(100, 200), st.integers(200, 10_000)))
    shape = draw(st.sampled_from(["list", "object", "mixed", "unclosed"]))
    if shape == "list":
        return Raw("[" * depth + "]" * depth)
    if shape == "object":
        return Raw('{"a": ' * depth + "1" + "}" * depth)
    if shape == "mixed":
        return Raw('[{"role": ' * depth + '"user"' + "}]" * depth)
    return Raw("[" * depth)  # never closed: bad JSON that is also deep


@st.composite
def long_string(draw: st.DrawFn) -> Raw:
    n = draw(st.sampled_from([1_000, 10_000, 100_000, 300_000]))
    unit = draw(st.sampled_from(["x", "word ", "é", "😀", "\n", "<end_of_turn>", "\\u0000", "{", "\""]))
    if unit == "\\u0000":  # escaped NUL characters
        return Raw('"' + unit * (n // 6) + '"')
    return Raw(json.dumps(unit * (n // len(unit))))


def wrong_type(current: Any) -> st.SearchStrategy[Any]:
    """A value of each JSON type but ``current``'s, and ``current`` wrapped in a list or an object: a reader that
    checks the value's type at once refuses it; one that uses it first (a dict lookup, a comparison) may fail."""
    kinds = [None, True, 0, -1, 1.5, "", "x", [], [1], {}, {"a": 1}, [current], {"x": current}]
    return st.sampled_from([k for k in kinds if type(k) is not type(current) or isinstance(k, list | dict)])


def replacement(current: Any) -> st.SearchStrategy[Any]:
    """A value for the place of ``current``: of the wrong type, random JSON, odd numbers, long text, deep
    nesting, lone surrogates."""
    return st.one_of(
        wrong_type(current),
        JSON_VALUES,
        st.sampled_from(NUMBERS).map(Raw),
        st.sampled_from(SURROGATES).map(lambda s: Raw(f'"{s}"')),
        long_string(),
        deep(),
    )


@st.composite
def mutated(draw: st.DrawFn, seed: dict[str, Any]) -> Any:
    """``seed`` with one to four changes: a value replaced, a key or item deleted, an unknown key added."""
    value = copy.deepcopy(seed)
    # one change mostly: a second one often fails first, and hides the first one's path from the readers
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        places = list(paths(value))
        change = draw(st.sampled_from(["replace", "replace", "replace", "delete", "insert"]))
        if change == "insert" or not places:
            where = draw(st.sampled_from(list(containers(value)) or [()]))
            parent = at_path(value, where)
            if isinstance(parent, dict):
                parent[draw(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)))] = draw(replacement(None))
            continue
        path = draw(st.sampled_from(places))
        parent = at_path(value, path[:-1])  # an object or a list: ``paths`` never goes into a spliced Raw
        if change == "delete":
            del parent[path[-1]]  # a list's item or an object's key
        else:
            parent[path[-1]] = draw(replacement(parent[path[-1]]))
    return value


# invalid UTF-8: a stray continuation byte, a cut sequence, an overlong form, an encoded surrogate, past U+10FFFF
BAD_UTF8 = [b"\xff", b"\x80", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xfe\xfe"]


@st.composite
def bodies(draw: st.DrawFn, endpoint: str) -> bytes:
    """A body for ``endpoint``: a seed as it is, mutated, then maybe broken as bytes; or no object at all."""
    how = draw(st.integers(0, 19))
    if how == 0:
        note("the empty body")
        return draw(st.sampled_from([b"", b" ", b"\n", b"\xef\xbb\xbf{}"]))
    if how == 1:
        top = draw(st.one_of(JSON_VALUES.filter(lambda v: not isinstance(v, dict)), deep(),
                             st.sampled_from(NUMBERS + ['"\\ud800"']).map(Raw)))
        note(f"a top level that is no object: {dump(top)[:200]!r}")
        return dump(top).encode()
    seed = draw(st.sampled_from(SEEDS[endpoint]))
    value = seed if how == 2 else draw(mutated(seed))
    text = dump(value).encode("utf-8", "surrogatepass")
    broken = draw(st.integers(0, 9))
    if broken == 0:
        cut = draw(st.integers(0, max(0, len(text) - 1)))
        note(f"cut at byte {cut} of {len(text)}")
        text = text[:cut]
    elif broken == 1:
        at = draw(st.integers(0, len(text)))
        bad = draw(st.sampled_from(BAD_UTF8))
        note(f"{bad!r} at byte {at}")
        text = text[:at] + bad + text[at:]
    note(f"body ({len(text)} bytes): {text[:600]!r}")
    return text


# -- the property --


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON that any client reads: no NaN or Infinity (Python's json writes them; JSON has none)."""
    def refuse(word: str) -> Any:
        raise ValueError(f"{word} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def assert_error_shape(endpoint: str, raw: bytes) -> None:
    """A 4xx in the endpoint's own API's error shape."""
    body = strict_json(raw)
    if endpoint in ANTHROPIC:
        assert isinstance(body, dict) and body.get("type") == "error", raw[:500]
        error = body.get("error")
        assert isinstance(error, dict) and isinstance(error.get("type"), str), raw[:500]
        assert isinstance(error.get("message"), str) and error["message"], raw[:500]
    else:
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict) and set(error) >= {"message", "type", "param", "code"}, raw[:500]
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), raw[:500]
        assert error["param"] is None or isinstance(error["param"], str), raw[:500]


# a stream's last event, by endpoint: a stream cut short (the server failed while writing it) has none of them
LAST_EVENTS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("data: [DONE]",), "/v1/completions": ("data: [DONE]",),
    "/v1/responses": ("event: response.completed", "event: response.incomplete", "event: response.failed"),
    "/v1/messages": ("event: message_stop", "event: error")}


def assert_stream(endpoint: str, raw: bytes) -> None:
    """A streamed 200: every event's data is JSON, none is a server error (OpenAI's ``server_error``, the Responses
    API's failed response, Anthropic's ``api_error``: whichever shape, the type's word is in it), and it ends with
    its API's last event."""
    blocks = [block for block in raw.decode("utf-8").split("\n\n") if block.strip()]
    for block in blocks:
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                strict_json(line.removeprefix("data: ").encode())
                assert '"server_error"' not in line and '"api_error"' not in line, line[:500]
                assert "internal error" not in line and "the answer failed" not in line, line[:500]
    assert blocks and blocks[-1].startswith(LAST_EVENTS[endpoint]), raw[-500:]


def check(server: Server, endpoint: str, body: bytes) -> None:
    """The property, for one body: under 500; a 4xx in the endpoint's shape; a 200 that a client can read."""
    TRIED[endpoint] += 1
    status, headers, raw = server.http("POST", endpoint, raw=body)
    STATUSES.setdefault(endpoint, Counter())[status] += 1
    if status >= 500:
        FIVE_XX[endpoint] += 1
    note(f"{status}: {raw[:600]!r}")
    assert status < 500, raw[:1000]
    if status >= 400:
        assert_error_shape(endpoint, raw)
    elif headers.get("content-type", "").startswith("text/event-stream"):
        assert_stream(endpoint, raw)
    else:
        assert isinstance(strict_json(raw), dict), raw[:500]
    # the server's log is checked after the fuzz, not here: a thread reads it, and a line may come after the answer
    # (then this body's checks would blame the next body, and hypothesis call the failure flaky)


def failures(log: list[str]) -> list[str]:
    """The log lines that say the server failed: a 500's line (app.py's ``answered``: "ENDPOINT failed: ..."), a
    stream's ("the answer failed: ..."), a traceback (uvicorn's, where even that failed)."""
    return [line for line in log if " failed: " in line or "the answer failed" in line or "internal error" in line
            or "Traceback" in line]


# -- the tests --


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[Server]:
    """One server for every endpoint, its limits small: a body that happens to be valid costs two tokens. No drafter
    (its first passes measure this machine's costs: seconds, and not what is fuzzed) and one thread: llama.cpp's
    threads wait for each other spinning, and beside another busy process two of them made every pass ~50x slower
    (2026-12-06, 2 cores)."""
    yield from start("--parallel", "2", "--ctx", "512", "-n", "2", "--max-tokens-cap", "2", "--queue-timeout", "30",
                     "--drafter", "none", "--threads", "1")


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    """The counts, for docs/hostile-inputs.md (seen with -s)."""
    yield
    for endpoint in SEEDS:
        if TRIED[endpoint]:
            statuses = ", ".join(f"{s}: {n}" for s, n in sorted(STATUSES.get(endpoint, Counter()).items()))
            print(f"\nfuzz {endpoint}: {TRIED[endpoint]} bodies tried, {FIVE_XX[endpoint]} 5xx ({statuses})",
                  end="")
    print(f"\nfuzz: {sum(TRIED.values())} bodies tried in all, {sum(FIVE_XX.values())} 5xx, "
          f"{sum('Traceback' in line for line in FAILED_LINES)} tracebacks and "
          f"{sum('Traceback' not in line for line in FAILED_LINES)} failure lines in the server's log")


def test_every_seed_is_valid(server: Server) -> None:
    """The seeds are what the fuzz starts from: each one a 200, so that a mutation is one step from a real body."""
    for endpoint, seeds in SEEDS.items():
        for seed in seeds:
            status, _, raw = server.http("POST", endpoint, seed)
            assert status == 200, (endpoint, seed, raw[:500])


# what the fuzz found (2026-12-06), each a 500 or a stream cut short, now a 400 naming the field: the bodies as
# hypothesis shrank them, to the field at fault
FOUND: list[tuple[str, bytes, str | None]] = [
    # a role that is a list or an object: unhashable, looked up in a dict (openai_body.py's _messages)
    ("/v1/chat/completions", b'{"messages": [{"role": ["user"], "content": "x"}], "max_tokens": 2}', "messages.0.role"),
    # what a Response repeats and no reader reads: a lone surrogate cannot be written as UTF-8, NaN is no JSON
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "metadata": {"a": "\\ud800"}}', "metadata"),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "stream": true, "reasoning": {"e": "\\udfff"}}',
     "reasoning"),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "stream": true, "metadata": {"a": NaN}}', "metadata"),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "text": {"verbosity": Infinity}}', "text"),
    # an Anthropic error quoting a block's type, a lone surrogate
    ("/v1/messages", b'{"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "\\ud800"}]}]}', None),
    ("/v1/messages/count_tokens", b'{"system": [{"type": "\\ud800", "text": "x"}], "messages": [{"role": "user", '
     b'"content": "x"}]}', None),
]


@pytest.mark.parametrize(("endpoint", "body", "param"), FOUND)
def test_what_the_fuzz_found_is_a_400(server: Server, endpoint: str, body: bytes, param: str | None) -> None:
    status, _, raw = server.http("POST", endpoint, raw=body)
    assert status == 400, raw[:500]
    assert_error_shape(endpoint, raw)
    if param is not None:
        assert json.loads(raw)["error"]["param"] == param, raw[:500]


@pytest.mark.parametrize("endpoint", list(SEEDS))
def test_no_body_is_a_5xx_and_every_error_is_in_the_endpoints_shape(server: Server, endpoint: str) -> None:
    """Each endpoint fuzzed on its own (its seeds, its error shape); then the server must still answer /health and
    its log must hold no traceback (a 5xx hidden behind a good status would show there)."""

    @FUZZ
    @given(body=bodies(endpoint))
    def fuzz(body: bytes) -> None:
        check(server, endpoint, body)

    logged = len(server.log)
    try:
        fuzz()
    finally:
        healthy = server.http("GET", "/health")[0] == 200
        time.sleep(0.5)  # the log's reader thread catches up with the last body's lines (uvicorn's come late)
        # this endpoint's lines only: the log is the module's server's, and another endpoint's failure is its own
        failed = failures(server.log[logged:])
        FAILED_LINES.extend(failed)
    assert healthy
    assert not failed, "".join(failed[:30])


# -- batch: good and bad lines in one file --


def bad_lines(rng: random.Random, good: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Lines that must fail, each with the id its error record must have: "line" where no id can be read (deep
    nesting, a cut line, a lone surrogate in the id: the caller makes it "line-N"), else the line's own. Each kind
    once, its details (which seed, which value, how deep, where cut) drawn from ``rng``."""
    wrong: list[Callable[[dict[str, Any]], None]] = [  # a value of the wrong type, each at its own field
        lambda line: line.__setitem__("messages", rng.choice([5, "hi", {}, [], [None], [[1]]])),
        lambda line: line["messages"][0].__setitem__("content", rng.choice([5, {"a": 1}, [1, 2], True])),
        lambda line: line["messages"][0].__setitem__("role", rng.choice([["user"], {"role": "user"}])),
        lambda line: line["messages"][0].__setitem__("role", rng.choice([3, "robot", None, True])),
        lambda line: line.__setitem__("max_tokens", rng.choice(["1", 1.5, -1, 0, True, [1]])),
        lambda line: line.__setitem__("temperature", rng.choice(["hot", 99, -1, [0]])),
        lambda line: line.__setitem__("stop", rng.choice([[1], [""], 5, ["a"] * 9])),
        lambda line: line.__setitem__("prompt", "and a prompt"),  # both: a line is one or the other
    ]
    out: list[tuple[str, str]] = []

    def base() -> dict[str, Any]:
        line = copy.deepcopy(rng.choice(good))
        line["id"] = f"bad-{len(out)}"
        return line

    for change in wrong:
        line = base()
        change(line)
        out.append((json.dumps(line), line["id"]))
    for _ in range(2):  # nested past any reader's bound (64) and past Python's recursion, as text
        line, depth = base(), rng.randint(100, 10_000)
        line["messages"][0]["content"] = Raw("[" * depth + "]" * depth)
        out.append((dump(line), "line"))
    for _ in range(2):  # cut short: no id can be read
        text = json.dumps(base())
        out.append((text[:rng.randint(1, len(text) - 1)], "line"))
    line = base()  # a lone surrogate in the content: an error under its id
    line["messages"][-1]["content"] = Raw('"a\\ud800b"')
    out.append((dump(line), line["id"]))
    line = base()  # in the id: no id its record could be written under
    line["id"] = Raw('"bad\\udfff"')
    out.append((dump(line), "line"))
    return out


def test_a_batch_of_good_and_bad_lines_gives_one_record_a_line(tmp_path: Path, model_path: Path) -> None:
    # the chat seeds' conversations as localspec's own lines (generated whole: no stream fields)
    good = [{"id": f"good-{i}", "messages": seed["messages"], "max_tokens": 1} for i, seed in enumerate(CHAT)]
    lines: list[tuple[str, str]] = [(json.dumps(line), line["id"]) for line in good]
    lines += bad_lines(random.Random(20261206), good)
    random.Random(7).shuffle(lines)
    expected = {name if name != "line" else f"line-{n}": name.startswith("good") for n, (_, name) in
                enumerate(lines, 1)}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes("".join(text + "\n" for text, _ in lines).encode("utf-8", "surrogatepass"))
    result = CliRunner().invoke(app, ["batch", str(inp), "-o", str(out), "--model", str(model_path),
                                      "--max-tokens", "1", "--ctx", "256", "--threads", "1", "--quiet"])
    assert "Traceback" not in result.output and result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(lines), (len(records), len(lines))
    got = {record["id"]: "error" not in record for record in records}
    assert got == expected, {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    assert result.exit_code == 1  # some lines failed, and said so


# the two schema bugs fuzzing found (2026-12-06) in code outside the readers: a JSON schema's "type" that is an object
# or holds a list (schema/numbers.py's ``bounded`` puts it in a set: TypeError), and a long non-ASCII string where a
# number belongs (llguidance 1.9.1 cuts its error message at byte 100, inside a character, and panics: pyo3's
# PanicException, a BaseException that schema/spec.py's ``_compiled`` and app.py's ``answered`` let through, so the
# answer is Starlette's plain-text 500). Each ends a whole batch job with a traceback before any line runs.
BAD_SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": {}}}},
    {"type": [["object"]]},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": "é" * 60}}},
]


def test_a_schema_of_the_wrong_type_is_a_400_and_fails_its_batch_line_alone(server: Server, tmp_path: Path,
                                                                             model_path: Path) -> None:
    for schema in BAD_SCHEMAS:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
        status, _, raw = server.http("POST", "/v1/chat/completions", body)
        assert status == 400, raw[:300]
        assert_error_shape("/v1/chat/completions", raw)
        status, _, raw = server.http("POST", "/v1/messages", {
            "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": schema}]})
        assert status == 400, raw[:300]
        assert_error_shape("/v1/messages", raw)
    lines = [{"id": "good", "prompt": "1, 2,"}, *({"id": f"bad-{i}", "messages": [{"role": "user", "content": "x"}],
                                                  "response_format": {"type": "json_schema", "json_schema": {
                                                      "name": "n", "schema": schema}}}
                                                 for i, schema in enumerate(BAD_SCHEMAS))]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = CliRunner().invoke(app, ["batch", str(inp), "-o", str(out), "--model", str(model_path),
                                      "--max-tokens", "1", "--ctx", "256", "--threads", "1", "--quiet"])
    assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit)), \
        result.exception
    records = {d["id"]: d for d in (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())}
    assert sorted(records) == ["bad-0", "bad-1", "bad-2", "good"] and "error" not in records["good"]
