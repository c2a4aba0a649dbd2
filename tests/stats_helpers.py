"""Chi-square goodness of fit without scipy (Wilson–Hilferty approximation of the critical value)."""

from __future__ import annotations

import math

import numpy as np


def chi_square_critical(df: int, z: float = 3.29) -> float:
    """Upper critical value of chi-square with ``df`` degrees of freedom at the normal quantile ``z``
    (3.29 ≈ p = 0.0005: a correct sampler fails one run in two thousand)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Statistic and degrees of freedom, pooling cells whose expected count is below 5."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = list(counts[~small]) + ([counts[small].sum()] if small.any() else [])
    exp = list(expected[~small]) + ([expected[small].sum()] if small.any() else [])
    obs_a, exp_a = np.array(obs, dtype=float), np.array(exp, dtype=float)
    keep = exp_a > 0
    stat = float((((obs_a[keep] - exp_a[keep]) ** 2) / exp_a[keep]).sum())
    return stat, max(1, int(keep.sum()) - 1)


def told_apart(probs: np.ndarray, wrong: np.ndarray, draws: int, trials: int = 20) -> int:
    """In how many of ``trials`` seeded samples of ``draws`` from ``wrong`` the chi-square test against ``probs``
    rejects: the power a test with that many draws has against that mistake."""
    told = 0
    for seed in range(trials):
        sample = np.random.default_rng(seed).choice(len(wrong), size=draws, p=wrong / wrong.sum())
        stat, df = chi_square(np.bincount(sample, minlength=len(probs)), probs)
        told += stat >= chi_square_critical(df)
    return told


def wrongs(probs: np.ndarray) -> dict[str, np.ndarray]:
    """What a broken sampler would draw instead of ``probs``: its best token taken always (drafts never turned
    down), or half again as often as it should be (the rest scaled down)."""
    top = int(np.argmax(probs))
    always = np.zeros_like(probs)
    always[top] = 1.0
    more = probs * max(0.0, 1 - 1.5 * probs[top]) / (1 - probs[top])
    more[top] = min(1.0, 1.5 * probs[top])
    return {"always": always, "half again": more}
