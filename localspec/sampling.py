"""Logits → token: greedy argmax on a view, or a shaped distribution and a seeded draw.

Shaping follows llama.cpp's sampler chain order (top-k → top-p → min-p → temperature), so the settings mean
what llama.cpp users expect. Work is proportional to the candidates kept, not the 262k vocabulary, except for
one softmax when top-k is off.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

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
    a seeded run gives the same text whatever the draft lengths were. Position j's stream is, and must stay,
    ``np.random.default_rng([seed, j])``'s: every seeded text ever written depends on it.

    Building that generator costs ~14 µs, nearly all of it numpy's SeedSequence hashing [seed, j] one position at a
    time. So after the first few draws (a short answer pays nothing up front) the seed words of a block of positions
    are hashed at once (``seed_states``, the same arithmetic over arrays) and each position's generator is a PCG64 on
    its precomputed words: ~2 µs a position, the same numbers (tests/test_positional_draws.py compares them).
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))
        # the fast way needs a seed numpy would take as one int (it raises on a negative one: numpy's way says so)
        self._seed_words = _uint32_words(self.seed) if isinstance(self.seed, int) and self.seed >= 0 else None
        self._first = 0  # the position of the block's first row
        self._states = np.empty((0, 4), dtype=np.uint64)
        self._direct = _DIRECT  # draws left before the first block

    def at(self, position: int) -> np.random.Generator:
        row = position - self._first
        if not 0 <= row < len(self._states):
            if self._direct > 0 or self._seed_words is None or not 0 <= position <= _LAST_BLOCK_START:
                self._direct -= 1
                return np.random.default_rng([self.seed, position])
            self._first, row = position, 0
            self._states = seed_states(self._seed_words, np.arange(position, position + _BLOCK, dtype=np.uint32))
        return np.random.Generator(np.random.PCG64(_SeedWords(self._states[row])))


# PositionalDraws: the draws made the plain way (~14 µs each) before a block is hashed (~190 µs for 256 positions,
# about as much as 14 plain draws), and the positions a block covers
_DIRECT = 16
_BLOCK = 256
_LAST_BLOCK_START = (1 << 32) - _BLOCK  # a position is one uint32 word; past that numpy's own way is used

# numpy's SeedSequence constants (numpy/random/bit_generator.pyx)
_MASK32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4


def _uint32_words(n: int) -> list[int]:
    """A non-negative int as SeedSequence reads it: 32-bit words, lowest first (one word for 0)."""
    words = [n & _MASK32]
    n >>= 32
    while n:
        words.append(n & _MASK32)
        n >>= 32
    return words


def seed_states(seed_words: list[int], positions: np.ndarray) -> np.ndarray:
    """``np.random.SeedSequence([seed, p]).generate_state(4, np.uint64)`` for each of ``positions`` (uint32), as the
    rows of one array: numpy's entropy mixing and state generation step for step, on arrays of positions instead
    of one position (uint32 arithmetic on arrays wraps around, as numpy's C does)."""
    n = len(positions)
    entropy = [np.full(n, w, dtype=np.uint32) for w in seed_words] + [positions.astype(np.uint32)]
    hash_const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        value = value ^ np.uint32(hash_const)
        hash_const = hash_const * _MULT_A & _MASK32
        value = value * np.uint32(hash_const)
        return value ^ (value >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
        return result ^ (result >> np.uint32(16))

    # SeedSequence.mix_entropy: the entropy up to the pool's size, every pool word into every other, then the rest
    zeros = np.zeros(n, dtype=np.uint32)
    pool = [hashmix(entropy[i] if i < len(entropy) else zeros) for i in range(_POOL_SIZE)]
    for i_src in range(_POOL_SIZE):
        for i_dst in range(_POOL_SIZE):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
    for i_src in range(_POOL_SIZE, len(entropy)):
        for i_dst in range(_POOL_SIZE):
            pool[i_dst] = mix(pool[i_dst], hashmix(entropy[i_src]))
    # SeedSequence.generate_state(4, np.uint64): eight 32-bit words from the pool, read as four little-endian uint64
    out = np.empty((n, 8), dtype=np.uint32)
    hash_const = _INIT_B
    for i in range(8):
        value = pool[i % _POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = hash_const * _MULT_B & _MASK32
        value = value * np.uint32(hash_const)
        out[:, i] = value ^ (value >> np.uint32(16))
    return out.astype("<u4").view("<u8").astype(np.uint64)


class _SeedWords(ISeedSequence):
    """A seed sequence whose state is already known (``seed_states``' row): what PCG64 asks for, and nothing else."""

    def __init__(self, state: np.ndarray) -> None:
        self._state = state

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words != 4 or np.dtype(dtype) != np.uint64:
            raise ValueError("only PCG64's seed (4 uint64 words) is known")
        return self._state
