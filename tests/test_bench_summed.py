"""tools/bench_summed.py: a suite's summed speedup sums each prompt's time a token."""

from __future__ import annotations

import pytest

from tests.script_modules import load_script


def _row(prompt: str, drafter: str, tps: float, speedup: float, category: str = "chat") -> dict:
    return {"prompt_id": prompt, "drafter": drafter, "tokens_per_second": tps, "speedup": speedup,
            "category": category}


def test_the_summed_speedup_sums_times_a_token_not_ratios() -> None:
    summed = load_script("bench_summed").summed
    results = [_row("slow", "none", 10.0, 1.0, "grounded"), _row("fast", "none", 100.0, 1.0),
               _row("slow", "ngram", 20.0, 2.0, "grounded"), _row("fast", "ngram", 50.0, 0.5)]
    row = summed(results)
    # target-only: 0.1 + 0.01 s a token; n-gram: 0.05 + 0.02: the slow prompt's gain outweighs the fast one's loss
    assert row["ngram"][0] == pytest.approx(0.11 / 0.07)
    assert row["ngram"][1] == 2.0 and row["none"] == (1.0, 1.0)


def test_a_prompt_without_a_target_only_run_is_left_out() -> None:
    summed = load_script("bench_summed").summed
    row = summed([_row("a", "none", 10.0, 1.0), _row("a", "ngram", 20.0, 2.0), _row("b", "ngram", 30.0, 3.0)])
    assert row["ngram"][0] == pytest.approx(2.0)
