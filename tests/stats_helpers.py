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
