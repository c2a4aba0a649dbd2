"""Exact verification of a draft against the target's pass over ``pending + draft``.

Row i of that pass is the target's prediction after ``pending + draft[:i]``, so a draft of k tokens comes with
k+1 rows: the last one yields the bonus token when the whole draft is accepted.

Greedy: accept while the draft equals the target's argmax; the first disagreement is replaced by the argmax.
Greedy needs only the argmax token id of each row (``Context.decode_argmax``: llama.cpp's backend sampler where
the build has one), never the logits.
Sampling: accept draft token x with probability min(1, p(x)/q(x)), else draw from normalise(max(0, p − q))
(Leviathan et al. 2023; Chen et al. 2023), so every emitted token is distributed exactly as the target's p.
A drafter without probabilities proposes deterministically: q is one-hot on x, so x is accepted with
probability p(x) and a rejection draws from p without x. We realise exactly that by drawing y ~ p and accepting
x iff y == x, with the random stream of the token's position: the text then depends only on the seed, never
on the draft, and equals plain sampling with the same seed.

Randomness comes from ``rng_at(i)``: a generator for the i-th position of this pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from localspec.drafters.base import Verdict
from localspec.sampling import Distribution, shape
from localspec.settings import SamplingSettings


def verify_greedy(draft: Sequence[int], best: Sequence[int]) -> Verdict:
    """``best[i]``: the target's argmax token after ``pending + draft[:i]`` (len(draft) + 1 of them)."""
    for i, x in enumerate(draft):
        if best[i] != x:
            return Verdict(i, best[i])
    return Verdict(len(draft), best[len(draft)])


def residual(p: Distribution, q: Distribution) -> Distribution:
    """normalise(max(0, p − q)): what the target still owes after the draft's proposal was turned down."""
    ids = np.union1d(p.ids, q.ids)
    r = np.maximum(p.on(ids) - q.on(ids), 0.0)
    if r.sum() <= 0.0:  # p == q: a rejection had probability 0; p itself is the right answer
        return p
    keep = r > 0
    return Distribution(ids[keep], r[keep] / r[keep].sum())


def accept_or_resample(
    p: Distribution, q: Distribution, x: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """One rejection-sampling decision for draft token x ~ q against target p."""
    px, qx = p.prob(x), q.prob(x)
    if qx > 0.0 and rng.random() < min(1.0, px / qx):
        return True, x
    return False, residual(p, q).sample(rng)


def verify_sampled(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution] | None,
    logits: np.ndarray,
    settings: SamplingSettings,
    rng_at: Callable[[int], np.random.Generator],
) -> Verdict:
    for i, x in enumerate(draft):
        p = shape(logits[i], settings)
        if draft_dists is None:  # one-hot q
            y = p.sample(rng_at(i))
            if y != x:
                return Verdict(i, y)
            continue
        accepted, token = accept_or_resample(p, draft_dists[i], x, rng_at(i))
        if not accepted:
            return Verdict(i, token)
    return Verdict(len(draft), shape(logits[len(draft)], settings).sample(rng_at(len(draft))))

