"""Rejection sampling reproduces the target's distribution exactly (chi-square over many draws)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.drafters.base import Verdict
from localspec.sampling import Distribution, shape
from localspec.settings import SamplingSettings
from localspec.speculative.verify import accept_or_resample, residual, verify_greedy
from tests.stats_helpers import chi_square, chi_square_critical

V = 12


def dense(d: Distribution) -> np.ndarray:
    out = np.zeros(V)
    out[d.ids] = d.probs
    return out


def random_dist(rng: np.random.Generator, support: int = V) -> Distribution:
    ids = np.sort(rng.choice(V, size=support, replace=False))
    return Distribution.of(ids, rng.dirichlet(np.ones(support)))


def first_token_counts(p: Distribution, q: Distribution | None, draws: int, seed: int) -> np.ndarray:
    """Draft x ~ q (one-hot on a fixed token when q is None), then verify against p; count emitted tokens."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(V, dtype=int)
    for _ in range(draws):
        if q is None:
            x, qq = 3, Distribution.one_hot(3)
        else:
            x, qq = q.sample(rng), q
        _, token = accept_or_resample(p, qq, x, rng)
        counts[token] += 1
    return counts


@pytest.mark.parametrize("case", range(4))
def test_full_q_reproduces_p(case: int) -> None:
    rng = np.random.default_rng(case)
    p, q = random_dist(rng, support=9), random_dist(rng, support=7)
    counts = first_token_counts(p, q, 20000, seed=100 + case)
    stat, df = chi_square(counts, dense(p))
    assert stat < chi_square_critical(df), (stat, df)
    assert counts[dense(p) == 0].sum() == 0  # never a token the target rules out


@pytest.mark.parametrize("case", range(4))
def test_one_hot_q_reproduces_p(case: int) -> None:
    rng = np.random.default_rng(10 + case)
    p = random_dist(rng, support=V)
    counts = first_token_counts(p, None, 20000, seed=200 + case)
    stat, df = chi_square(counts, dense(p))
    assert stat < chi_square_critical(df), (stat, df)


def test_a_biased_sampler_is_caught() -> None:
    """The test above can fail: accepting every draft (a wrong verifier) gives q, not p."""
    rng = np.random.default_rng(5)
    p, q = random_dist(rng, support=9), random_dist(rng, support=7)
    counts = np.zeros(V, dtype=int)
    for _ in range(20000):
        counts[q.sample(rng)] += 1
    stat, df = chi_square(counts, dense(p))
    assert stat > chi_square_critical(df)


def test_residual_is_normalised_positive_part() -> None:
    p = Distribution.of(np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]))
    q = Distribution.of(np.array([1, 2, 3]), np.array([0.6, 0.1, 0.3]))
    r = residual(p, q)
    assert list(r.ids) == [0, 2]
    np.testing.assert_allclose(r.probs, [0.5 / 0.6, 0.1 / 0.6])


def test_greedy_verification_accepts_the_agreeing_prefix_then_corrects() -> None:
    best = [3, 5, 7, 9]  # the target's argmax after pending, pending + d0, ...: token ids, no logits
    assert verify_greedy([3, 5, 8], best) == Verdict(2, 7)
    assert verify_greedy([3, 5, 7], best) == Verdict(3, 9)
    assert verify_greedy([4], best) == Verdict(0, 3)
    assert verify_greedy([], best[:1]) == Verdict(0, 3)


def test_shape_follows_top_k_top_p_min_p() -> None:
    row = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    d = shape(row, SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    assert list(d.ids) == [0, 1, 2]
    d = shape(row, SamplingSettings(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0))
    assert list(d.ids) == [0, 1]
    d = shape(row, SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert list(d.ids) == [0, 1, 2]
    np.testing.assert_allclose(d.probs, np.array([0.4, 0.3, 0.15]) / 0.85, rtol=1e-5)
    cold = shape(row, SamplingSettings(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0))
    assert cold.probs[0] > 0.4 / 0.85
