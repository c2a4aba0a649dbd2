"""Logits → token: greedy argmax on a view, or a shaped distribution and a seeded draw.

Shaping follows llama.cpp's sampler chain order (top-k → top-p → min-p → temperature), so the settings mean
what llama.cpp users expect. Work is proportional to the candidates kept, not the 262k vocabulary, except for
one softmax when top-k is off.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from localspec.settings import SamplingSettings

_NUCLEUS_PROBE = 256  # candidates sorted before falling back to a full sort for top-p


def greedy(row: np.ndarray) -> int:
    """Argmax of one logits row: no copy, no softmax."""
    return int(row.argmax())


@dataclass(frozen=True, slots=True)
class Distribution:
    """A sparse distribution over token ids (ids sorted ascending, probs summing to 1)."""

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, weights: np.ndarray) -> Distribution:
        order = np.argsort(ids, kind="stable")
        probs = weights[order].astype(np.float64)
        return cls(ids[order].astype(np.int64), probs / probs.sum())

    @classmethod
    def one_hot(cls, token: int) -> Distribution:
        return cls(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob(self, token: int) -> float:
        i = int(np.searchsorted(self.ids, token))
        return float(self.probs[i]) if i < len(self.ids) and self.ids[i] == token else 0.0

    def on(self, ids: np.ndarray) -> np.ndarray:
        """Probabilities of ``ids`` (sorted) under this distribution, 0 where absent."""
        i = np.searchsorted(self.ids, ids)
        i_clipped = np.minimum(i, len(self.ids) - 1)
        hit = self.ids[i_clipped] == ids
        return np.where(hit, self.probs[i_clipped], 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return int(self.ids[min(i, len(self.ids) - 1)])


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def shape(row: np.ndarray, s: SamplingSettings) -> Distribution:
    """The distribution a sampler with settings ``s`` draws from, given one logits row."""
    if 0 < s.top_k < row.shape[0]:
        ids = top_k(row, s.top_k)
        return shape_candidates(ids, row[ids], s)
    return shape_candidates(np.arange(row.shape[0]), row, s)  # every token a candidate: the row as it is


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` largest of ``values`` (0 < k <= len), in no order: the one top-k, for a whole row
    (``shape``) and for a grammar's allowed tokens (structured/constraint.py)."""
    return np.argpartition(values, len(values) - k)[len(values) - k :]


def shape_candidates(ids: np.ndarray, logits: np.ndarray, s: SamplingSettings) -> Distribution:
    """``shape`` after its top-k: top-p, min-p and temperature over the candidates ``ids`` (their ``logits``); a
    grammar's mask chooses the candidates first (structured/constraint.py)."""
    logits = logits.astype(np.float64)
    # top-p: the smallest set of most likely tokens whose mass reaches top_p (at temperature 1, like llama.cpp)
    if s.top_p < 1.0:
        probs = _softmax(logits)
        m = min(_NUCLEUS_PROBE, len(probs))
        head = top_k(probs, m) if m < len(probs) else np.arange(m)
        if probs[head].sum() < s.top_p:
            head = np.arange(len(probs))
        head = head[np.argsort(-probs[head], kind="stable")]
        cut = int(np.searchsorted(np.cumsum(probs[head]), s.top_p)) + 1
        keep = head[: max(1, cut)]
        ids, logits = ids[keep], logits[keep]
    # min-p: drop tokens less likely than min_p × the most likely one (a threshold in logit space)
    if s.min_p > 0.0:
        keep = logits >= logits.max() + math.log(s.min_p)
        ids, logits = ids[keep], logits[keep]
    temperature = s.temperature if s.temperature > 0 else 1.0
    return Distribution.of(ids, _softmax(logits / temperature))


def pick(
    row: np.ndarray, sampling: SamplingSettings, rng: np.random.Generator, p_min: float = 0.0,
) -> tuple[int, Distribution | None] | None:
    """The draft model's next token from its logits ``row``: the argmax (greedy) or a draw from q (sampled, q
    returned for verification); None where its probability is under ``p_min`` (the draft stops there)."""
    if sampling.greedy:
        if p_min > 0.0 and top_probability(row) < p_min:
            return None
        return greedy(row), None
    q = shape(row, sampling)
    if p_min > 0.0 and float(q.probs.max()) < p_min:
        return None
    return q.sample(rng), q


def top_probability(row: np.ndarray) -> float:
    """The most likely token's probability: the whole row is looked at (a draft stops on it), in a scratch row kept
    per thread, so a drafted token allocates nothing the size of the vocabulary."""
    m = float(row.max())
    scratch = getattr(_scratch, "row", None)
    if scratch is None or scratch.shape != row.shape or scratch.dtype != row.dtype:
        scratch = _scratch.row = np.empty_like(row)
    np.subtract(row, m, out=scratch)
    return 1.0 / float(np.exp(scratch, out=scratch).sum())


_scratch = threading.local()


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


class PositionalDraws:
    """One independent random stream per sequence position, derived from the seed.

    The token drawn at position j then depends on (seed, j, logits) only, not on how many draws came before:
    a seeded run gives the same text whatever the draft lengths were.
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))

    def at(self, position: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, position])
