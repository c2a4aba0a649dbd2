"""How far llama.cpp's numerics move logits between batch shapes, and how close a prediction's top two are: what
separates a near-tie (a token that may rightly go either way) from a real divergence."""

from __future__ import annotations

import numpy as np

from localspec.engine import Context, Model


def batch_noise(model: Model, tokens: list[int]) -> float:
    """Max |Δ| of the top-5 logits between decoding ``tokens`` in one batch and one at a time."""
    with Context(model, n_ctx=512) as batched, Context(model, n_ctx=512) as single:
        rows = batched.decode(tokens, all_logits=True).copy()
        worst = 0.0
        for i, t in enumerate(tokens):
            row = single.decode([t], all_logits=True)[0]
            top = np.argsort(row)[-5:]
            worst = max(worst, float(np.abs(rows[i][top] - row[top]).max()))
    return worst


def top2_gap(model: Model, tokens: list[int]) -> float:
    """The margin of the prediction after ``tokens``: its best logit less its second."""
    with Context(model, n_ctx=512) as ctx:
        a, b = np.sort(ctx.decode(tokens)[-1])[-2:]
    return float(b - a)
