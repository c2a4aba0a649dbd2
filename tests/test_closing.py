"""A tool call is shut before its tokens run out, not cut: in its last tokens the grammar's closers are chosen
(structured/constraint.py, ``close_at``), so a small model that runs a value on still answers with a call that
parses, with or without drafts (the closing depends only on the position and the text; where the two runs differ,
it is at a near-tie of the model's, as any two greedy runs of different pass sizes may)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import localspec as api
from localspec.structured.constraint import _Nesting, closing_room
from tests.test_tool_auto import CURRENCY, WEATHER


def test_what_is_open_is_shut_innermost_first() -> None:
    n = _Nesting()
    n.feed(b'{"name": "f", "arguments": {"list": [1, {"s": "a \\" } ] still')
    assert n.shutting() == b'"}]}}'
    n.feed(b'"')
    assert n.shutting() == b"}]}}"
    assert closing_room(96) == 16 and closing_room(20) == 10 and closing_room(2) == 1


@pytest.mark.parametrize("max_tokens", [32])
def test_a_call_that_would_run_past_its_tokens_is_shut_valid_with_and_without_drafts(
        model_path: Path, max_tokens: int) -> None:
    ask = {"messages": [{"role": "user", "content": "How many yen is 250 USD?"}], "tools": [WEATHER, CURRENCY],
           "tool_choice": {"type": "function", "function": {"name": "convert_currency"}}, "max_tokens": max_tokens}
    for drafter in ("none", "ngram"):
        r = api.generate(ask, drafter=drafter, keep_history=False, parallel=1, ctx=1024)
        assert r.finish_reason == "tool_calls", (drafter, r.text)
        call = r.tool_calls[0]["function"]
        arguments = json.loads(call["arguments"])
        params = {"get_weather": WEATHER, "convert_currency": CURRENCY}[call["name"]]["function"]["parameters"]
        assert set(params["required"]) <= set(arguments)
        assert r.stats.generated_tokens <= max_tokens
