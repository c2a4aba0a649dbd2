"""Drafting from a prediction (drafters/prediction.py) on the batch-invariant toy model: the text never changes, a
right prediction is drafted from, an edited one is found again after the edit, a wrong one is soon left alone."""

from __future__ import annotations

import pytest

from localspec.drafters.base import Draft
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.prediction import PredictionDrafter
from localspec.events import Finished, Stats, Step
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.loop import Generator
from localspec.speculative.policy import DraftPolicy
from localspec.tokens import in_order
from tests.toy import ToyContext, ToyModel, plain_greedy

TARGET = ToyModel(seed=1608)  # an answer that does not repeat itself for 46 tokens (the toy's longest: seeds 1-3000)
GREEDY = SamplingSettings(temperature=0.0)
PROMPT = [1, 2, 3, 4]
N = 44


def answer(prediction: list[int], drafters: str = "ngram", k: int | None = None,
           policy: DraftPolicy | None = None) -> tuple[list[int], list[Step], Stats]:
    ctx = ToyContext(TARGET)
    lookups = {"none": [], "ngram": [NgramDrafter()]}[drafters]
    gen = Generator(ctx, TARGET, lookups, GREEDY, policy or DraftPolicy(k_max=16, fixed=k))  # type: ignore[arg-type]
    steps: list[Step] = []
    tokens: list[int] = []
    stats = Stats()
    for event in gen.generate(PROMPT, GenerationSettings(max_tokens=N, prediction=tuple(prediction))):
        if isinstance(event, Step):
            steps.append(event)
            tokens.extend(t.id for t in event.emitted)
        elif isinstance(event, Finished):
            stats = event.stats
    assert ctx.tokens == (PROMPT + tokens)[:-1]
    return tokens, steps, stats


EXPECTED = plain_greedy(TARGET, PROMPT, N)


def edited(tokens: list[int]) -> list[int]:
    """The answer with a run replaced in its middle, a run left out after it and one put in near its end."""
    n = len(tokens)
    return [*tokens[: n // 4], 40, 41, 42, *tokens[n // 4 + 3 : n // 2], *tokens[n // 2 + 4 : 3 * n // 4],
            43, 44, *tokens[3 * n // 4 :]]


@pytest.mark.parametrize("k", [None, 4, 16])
@pytest.mark.parametrize("kind", ["exact", "edited", "unrelated", "longer"])
def test_the_text_is_the_target_s_whatever_the_prediction(k: int | None, kind: str) -> None:
    prediction = {"exact": EXPECTED, "edited": edited(EXPECTED), "unrelated": [7, 8, 9, 10] * 20,
                  "longer": EXPECTED + EXPECTED}[kind]
    got, _, stats = answer(prediction, k=k)
    assert got == EXPECTED
    assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens == len(prediction)


def test_a_right_prediction_is_drafted_from_the_answer_s_first_token() -> None:
    _, steps, stats = answer(EXPECTED, k=8)
    assert steps[0].kind == "prediction/follow" and len(steps[0].accepted) == 8
    assert stats.prediction_accepted == stats.accepted == len(EXPECTED) - stats.target_passes
    assert stats.accepted_prediction_tokens == len(EXPECTED) and stats.rejected_prediction_tokens == 0


def test_after_an_edit_the_place_in_the_prediction_is_found_again() -> None:
    prediction = edited(EXPECTED)
    _, steps, stats = answer(prediction, k=8)
    # the edits cost a few passes each: nearly everything else came from the prediction
    assert stats.target_passes <= len(EXPECTED) // 8 + 12
    assert stats.prediction_accepted >= len(EXPECTED) - 20
    resumed = [s.kind for s in steps if s.kind.startswith("prediction/") and s.kind not in
               ("prediction/follow",)]
    assert resumed, "the place was never looked for again"
    assert stats.accepted_prediction_tokens == in_order(prediction, EXPECTED)


def test_a_wrong_prediction_is_soon_left_to_the_other_drafters() -> None:
    _, steps, stats = answer([7, 8, 9, 10] * 20)
    assert stats.prediction_accepted == 0
    # learned in hindsight: once it is known to be wrong, nothing of it is verified
    assert stats.prediction_drafted <= 6


def test_under_drafter_none_nothing_is_drafted_but_the_usage_is_counted() -> None:
    got, steps, stats = answer(EXPECTED, drafters="none")
    assert got == EXPECTED and stats.drafted == 0 and stats.target_passes == len(EXPECTED)
    assert stats.accepted_prediction_tokens == len(EXPECTED)


def test_what_a_prediction_earned_is_forgotten_with_its_generation() -> None:
    policy = DraftPolicy(k_max=16)
    policy.calibrate({rows: 0.01 * (1 + 0.05 * rows) for rows in range(1, 18)})  # a pass of 17 rows: 1.85 of one
    _, steps, _ = answer(EXPECTED, policy=policy)
    assert max(s.k for s in steps) == 16  # the prediction earned long drafts
    # the next request's prediction (a wrong one) starts from the prior, not from what the last one earned, and its
    # first miss ends its long drafts
    _, steps, _ = answer([EXPECTED[0], *range(30, 46)], policy=policy)
    assert steps[0].kind == "prediction/follow" and steps[0].k < 16
    assert all(s.k <= 3 for s in steps[1:] if s.kind.startswith("prediction/"))
    assert not any(kind.startswith("prediction/") for kind in policy.learned)


def test_the_drafter_looks_near_its_last_place_first() -> None:
    # "5 6" occurs twice: after the answer left the prediction at position 10, the place found again is the later one
    prediction = [5, 6, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 5, 6, 30, 31]
    d = PredictionDrafter(prediction)
    history = [99]
    d.begin(history)
    history += prediction[:10]
    d.accept(history, 9)
    assert d.propose(history, 3).tokens == [28, 29, 5]
    history += [77, 5, 6]  # an edit, then the answer rejoins at a "5 6"
    d.accept(history, 0)
    draft = d.propose(history, 3)
    assert draft.tokens == [30, 31] and draft.kind == "prediction/2"


def test_forced_tokens_that_follow_the_prediction_keep_its_place() -> None:
    prediction = [10, 11, 12, 13, 14, 15]
    d = PredictionDrafter(prediction)
    d.begin([1])
    # a grammar forced 10 11 after the accepted history: the drafts go on after them
    assert d.propose([1, 10, 11], 3).tokens == [12, 13, 14]
    # forced tokens the prediction does not hold: the place is looked for from the tokens themselves
    assert d.propose([1, 40, 12], 2).tokens == [13, 14]


@pytest.mark.parametrize(("a", "b", "n"), [
    ([1, 2, 3, 4], [1, 2, 3, 4], 4),
    ([1, 2, 3, 4], [1, 9, 3, 4], 3),
    ([1, 2, 3, 4], [4, 3, 2, 1], 1),
    ([1, 2, 3], [], 0),
    ([1, 2, 3, 4, 5, 6], [1, 2, 7, 8, 5, 6, 9], 4),
])
def test_prediction_usage_counts_its_tokens_found_in_order(a: list[int], b: list[int], n: int) -> None:
    assert in_order(a, b) == n


def test_a_token_written_in_place_of_the_prediction_s_is_taken_for_a_one_token_edit() -> None:
    prediction = [10, 11, 12, 13, 14, 15, 16]
    d = PredictionDrafter(prediction)
    d.begin([1])
    assert d.propose([1], 4).tokens == [10, 11, 12, 13]
    d.accept([1, 10, 11, 99], 2)  # 99 where the prediction has 12 (a rename): the text goes on with 13
    draft = d.propose([1, 10, 11, 99], 3)
    assert draft.tokens == [13, 14, 15] and draft.kind == "prediction/swap"
    d.accept([1, 10, 11, 99, 13, 14], 1)  # it did: the place is the prediction's again
    assert d.propose([1, 10, 11, 99, 13, 14], 2) == Draft([15, 16], None, "prediction", "prediction/follow")


def test_after_a_line_put_in_the_prediction_goes_on_where_it_was_not_a_line_later() -> None:
    nl = 9  # a newline: it ends every line, so one token of it matches everywhere
    prediction = [1, nl, 2, nl, 3, nl]  # lines A, B, C
    d = PredictionDrafter(prediction)
    d.begin([0])
    history = [0, 1, nl]
    d.accept(history, 1)  # "A\n" as predicted
    history += [7]
    d.accept(history, 0)  # a line put in: "X1 X2\n" ...
    assert d.propose(history, 2).kind == "prediction/swap"  # (taken for a one-token edit first)
    history += [8, nl]
    d.accept(history, 0)
    # ... then B, where the prediction was: not C, the next line's match after it
    assert d.propose(history, 2).tokens == [2, nl]
