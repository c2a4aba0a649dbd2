"""The Python face, ``localspec.generate_many`` / ``localspec.generate``, held to what its docstring promises
(issue #27): a string where a list belongs, a wrong type and ids used twice are UserErrors before the model loads;
one bad prompt is an error result and the rest run; ``stop`` may be one string."""

from __future__ import annotations

from pathlib import Path

import pytest

import localspec
from localspec.engine.chat import Message
from localspec.errors import UserError
from localspec.request import Request
from tests.lossless import assert_lossless, assert_lossless_text, checking_model, margin


@pytest.mark.parametrize(("prompts", "options", "message"), [
    ("hey", {}, "a list of prompts, not one str"),
    ({"prompt": "hey"}, {}, "a list of prompts"),
    (["a"], {"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    (["a"], {"max_tokens": 2.5}, "max_tokens must be an integer"),
    (["a"], {"max_tokens": True}, "max_tokens must be an integer"),
    (["a"], {"seed": "1"}, "seed must be an integer (or None)"),
    (["a"], {"stop": ["ok", 3]}, "stop must be a string or a list of strings"),
    (["a"], {"drafter": 5}, "drafter must be a string"),
    (["a"], {"drafter": "draft"}, "drafter draft needs a draft model: pass draft NAME|PATH"),
    (["a"], {"draft": 5}, "draft must be a string (or None)"),
    (["a"], {"drafter": "bogus"}, "unknown drafter 'bogus'"),
    (["a"], {"profile": "nope"}, "unknown profile 'nope': use one of"),
    (["a"], {"profile": 5}, "profile must be a string (or None)"),
    (["a"], {"ctx": 10}, "ctx must be at least 16 tokens, got 10"),  # the argument's name, not the flag's
    (["a"], {"gpu_layers": -5}, "gpu_layers must be -1 (all), 0 (CPU) or a count"),
    (["a", {"id": "0", "prompt": "b"}], {}, "id '0' is given to prompt 0 and prompt 1"),
    ([Request("x", prompt="a"), Request("x", prompt="b")], {}, "ids must be unique"),
])
def test_bad_calls_are_a_user_error_before_the_model_loads(prompts: object, options: dict, message: str) -> None:
    with pytest.raises(UserError) as got:
        list(localspec.generate_many(prompts, model="/nonexistent/never-loaded.gguf", **options))  # type: ignore[arg-type]
    assert message in str(got.value) and "--" not in str(got.value)


def test_generate_raises_a_user_error_for_a_prompt_it_cannot_read() -> None:
    with pytest.raises(UserError, match="lone surrogate"):
        localspec.generate("a\ud800b", model="/nonexistent/never-loaded.gguf")
    with pytest.raises(UserError, match="messages must be a non-empty list"):
        localspec.generate({"messages": []}, model="/nonexistent/never-loaded.gguf")


@pytest.mark.parametrize(("request_", "message"), [
    (Request("a", prompt="hi", k=500), "speculation.k must be between 0 and 16, got 500"),
    (Request("a", prompt="hi", drafter="draft"), "speculation.drafter must be none, ngram or auto"),
    (Request("a"), "give either a prompt or messages"),
    (Request("a", prompt="hi", messages=(Message("user", "hi"),)), "give either a prompt or messages"),
    (Request("a", prompt="hi", temperature=-1.0), "temperature must be between 0 and 5"),
    (Request("a", prompt="hi", style="json"), "style must be one of plain"),
    (Request(7, prompt="hi"), "id must be a string"),  # type: ignore[arg-type]
    (Request("a", prompt="hi", prediction=b"x"), "prediction.content must be a string"),  # type: ignore[arg-type]
])
def test_a_request_built_in_python_is_read_as_a_line_would_be(request_: Request, message: str) -> None:
    # a Request skips the body reader unless it is read like one: k=500 used to run (and no prompt ran on nothing)
    with pytest.raises(UserError, match="prompt") as got:
        localspec.generate(request_, model="/nonexistent/never-loaded.gguf")
    assert message in str(got.value)


def test_a_bad_prompt_is_an_error_result_and_a_stop_string_is_one_string(model_path: Path) -> None:
    prompts = [
        "Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
        {"id": "bad", "prompt": "p", "temperature": "hot"},
        "a\ud800b",
        {"id": None, "prompt": "1, 2, 3,"}  # a null id: named by its place,
    ]
    results = list(localspec.generate_many(prompts, model=str(model_path), ctx=256, max_tokens=8, parallel=2,
                                           ordered=True, stop="country"))
    assert [r.id for r in results] == ["0", "bad", "2", "3"]
    assert [r.ok for r in results] == [True, False, False, True]
    assert "temperature must be a number" in (results[1].error or "")
    assert "lone surrogate" in (results[2].error or "")
    # "country" split into letters would have stopped at the first c, o, u, n, t, r or y
    assert len(results[0].tokens) == 8 and any(c in results[0].text for c in "country"), results[0].text


def test_profile_means_what_the_flag_means(model_path: Path) -> None:
    # gemma3-270m-early-exit: the embedded model drafted by its own first 6 layers (k pinned: on a CPU the policy
    # finds it does not pay); a drafter given overrides the profile's
    prompt = "List the planets of the solar system in order:"
    drafted = localspec.generate(prompt, profile="gemma3-270m-early-exit", k=2, max_tokens=24, keep_history=False)
    plain = localspec.generate(prompt, profile="gemma3-270m-early-exit", drafter="none", max_tokens=24,
                               keep_history=False)
    assert drafted.error is None and drafted.stats.drafted > 0 and plain.stats.drafted == 0
    model = checking_model(model_path)  # both the target's greedy text, each at every position
    tokens = model.vocab.tokenize(prompt, add_special=True, parse_special=True)
    for result in (drafted, plain):
        assert_lossless(model, tokens, result.tokens, margin(model))


def test_a_prediction_through_the_python_api_is_drafted_from_and_counted(model_path: Path) -> None:
    prompt = "Copy this line: The meeting moved to Tuesday at 10:30 in room 4B.\nCopy:"
    plain = localspec.generate(prompt, model=str(model_path), ctx=256, max_tokens=24, k=4)
    predicted = localspec.generate(prompt, model=str(model_path), ctx=256, max_tokens=24, k=4,
                                   prediction=plain.text)
    model = checking_model(model_path)
    assert_lossless_text(model, prompt, predicted.text, margin(model))  # the target's text, drafted or not
    assert predicted.stats.accepted_prediction_tokens >= 20 and predicted.stats.prediction_accepted >= 12
    # a line's own OpenAI field, and one too large: its error result names the field
    results = list(localspec.generate_many(
        [{"id": "p", "prompt": prompt, "prediction": {"type": "content", "content": plain.text}},
         {"id": "big", "prompt": prompt, "prediction": {"type": "content", "content": "word " * 9000}}],
        model=str(model_path), ctx=256, max_tokens=24, k=4, ordered=True))
    assert results[0].stats.accepted_prediction_tokens >= 20
    assert not results[1].ok and "the prediction is" in (results[1].error or "")
