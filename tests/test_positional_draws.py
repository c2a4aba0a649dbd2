"""The random stream of a (seed, position) is numpy's ``default_rng([seed, position])``, whichever way
``PositionalDraws`` builds it: every seeded text depends on these numbers, so the fast way must draw exactly them."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.sampling import PositionalDraws, _uint32_words, seed_states

SEEDS = [0, 1, 7, 12345, (1 << 32) - 1, 1 << 32, (1 << 32) + 5, (1 << 63) - 1, (1 << 64) + 3, (1 << 130) + 99]
POSITIONS = [0, 1, 2, 255, 256, 1000, 4097, (1 << 31) + 1, (1 << 32) - 1]


def _draws(rng: np.random.Generator) -> list[float]:
    """What the loop draws (``random``: Distribution.sample, accept_or_resample), and more of the stream."""
    return [*(rng.random() for _ in range(4)), float(rng.integers(1 << 62)), float(rng.standard_normal())]


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_states_are_numpys_seed_sequence(seed: int) -> None:
    positions = np.array([*POSITIONS, *range(300, 364)], dtype=np.uint32)
    states = seed_states(_uint32_words(seed), positions)
    for p, state in zip(positions, states, strict=True):
        expected = np.random.SeedSequence([seed, int(p)]).generate_state(4, np.uint64)
        assert state.dtype == np.uint64 and (state == expected).all(), (seed, int(p))


@pytest.mark.parametrize("seed", [*SEEDS, None])
def test_every_position_draws_what_default_rng_draws(seed: int | None) -> None:
    rng = np.random.default_rng(seed if seed is not None else 3)
    draws = PositionalDraws(seed)
    # as the loop asks: forward, a pass's positions again after a rejection, a few jumps (a new block), and past
    # the last position a block can start at
    positions = [p for start in range(40, 2000, 9) for p in range(start, start + int(rng.integers(1, 9)))]
    positions += [int(p) for p in rng.integers(0, 1 << 20, 40)] + [(1 << 32) - 3, (1 << 32) - 1, 1 << 33, 17]
    fast = 0
    for p in positions:
        made = draws.at(p)
        fast += type(made.bit_generator.seed_seq).__name__ == "_SeedWords"
        assert _draws(made) == _draws(np.random.default_rng([draws.seed, p])), (seed, p)
    assert fast > len(positions) // 2  # the fast way was the one compared, not only numpy's own


def test_a_negative_seed_is_refused_as_numpy_refuses_it() -> None:
    with pytest.raises(ValueError):
        for p in range(40):
            PositionalDraws(-1).at(p)
