"""Suite parsing: good rows, every kind of bad row (with its line number), the shipped default suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.bench.suite import DEFAULT_MAX_TOKENS, load_suite, parse_suite
from localspec.errors import UserError


def _row(**kw: object) -> str:
    return json.dumps({"id": "a", "category": "chat", "prompt": "Hi", **kw})


def test_good_rows_with_and_without_max_tokens_and_blank_lines() -> None:
    text = "\n".join([_row(max_tokens=32), "", json.dumps({"id": "b", "category": "code", "prompt": "def f():"})])
    suite = parse_suite(text, "s.jsonl")
    assert [p.id for p in suite.prompts] == ["a", "b"]
    assert suite.prompts[0].max_tokens == 32
    assert suite.prompts[1].max_tokens == DEFAULT_MAX_TOKENS
    assert suite.categories == ["chat", "code"]
    assert [p.max_tokens for p in suite.with_max_tokens(7).prompts] == [7, 7]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "s.jsonl:2: not valid JSON"),
        ("[1, 2]", "s.jsonl:2: expected a JSON object, got list"),
        (json.dumps({"id": "b", "prompt": "x"}), "s.jsonl:2: missing 'category'"),
        (json.dumps({"id": "b", "category": "", "prompt": "x"}), "s.jsonl:2: 'category' must be a non-empty string"),
        (json.dumps({"id": 3, "category": "c", "prompt": "x"}), "s.jsonl:2: 'id' must be a non-empty string"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "max_tokens": 0}), "'max_tokens' must be a positive"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "max_tokens": True}), "got true"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "max_token": 5}), "unknown key 'max_token'"),
        (_row(), "s.jsonl:2: duplicate id 'a' (first on line 1)"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "chat": "yes"}), "'chat' must be true or false"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "prediction": 5}), "'prediction' must be a non-empty"),
        (json.dumps({"id": "b", "category": "c", "prompt": "x", "prediction": " "}), "'prediction' must be"),
    ],
)
def test_bad_rows_name_the_line_and_the_reason(line: str, message: str) -> None:
    with pytest.raises(UserError) as exc:
        parse_suite(_row() + "\n" + line + "\n", "s.jsonl")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_empty_suite() -> None:
    with pytest.raises(UserError, match="the suite is empty"):
        parse_suite("\n  \n", "empty.jsonl")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="suite file not found"):
        load_suite(tmp_path / "nope.jsonl")


def test_default_suite_ships_and_covers_the_categories() -> None:
    suite = load_suite(None)
    assert len(suite.prompts) >= 10
    assert set(suite.categories) >= {"grounded", "code", "chat", "creative"}
    assert all(p.max_tokens > 0 for p in suite.prompts)


def test_the_shared_suite_parses() -> None:
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "prompts.jsonl"
    if not shared.exists():
        pytest.skip("no ../shared/bench/prompts.jsonl in this checkout")
    assert load_suite(shared).prompts


@pytest.mark.parametrize("name", ["edits", "edits-chat"])
def test_the_edits_suites_have_both_kinds_each_row_with_its_prediction(name: str) -> None:
    suite = load_suite(Path(name))
    assert set(suite.categories) == {"edit-in-prompt", "edit-prediction-only"}
    for p in suite.prompts:
        assert p.chat == (name == "edits-chat") and p.prediction
        # the file is in the prompt too, or only in the prediction
        assert (p.prediction.strip()[:40] in p.prompt) == (p.category == "edit-in-prompt"), p.id
