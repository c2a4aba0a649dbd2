"""localspec/tokens.py: the common start of two token sequences (compared a block at a time for lists), and the one
catch-up of a draft cache."""

from __future__ import annotations

import random
from collections.abc import Sequence

from localspec.tokens import backlog, common_prefix


def _walked(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def test_the_common_start_is_the_one_a_walk_finds_for_every_length_and_type() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 300))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 200))]
        for x, y in ((a, b), (b, a), (tuple(a), b), (a, tuple(b)), (a, list(a))):
            assert common_prefix(x, y) == _walked(x, y)
    assert common_prefix([1] * 130 + [2], [1] * 130 + [3]) == 130  # past two whole blocks, inside the third


class _Cache:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


def test_a_cache_is_rolled_back_to_where_it_agrees_and_always_decodes_the_last_token() -> None:
    behind = _Cache([1, 2])
    assert backlog(behind, [1, 2, 3, 4]) == [3, 4] and behind.tokens == [1, 2]
    level = _Cache([1, 2, 3, 4])  # holds the whole history: its last token is decoded again, for its logits
    assert backlog(level, [1, 2, 3, 4]) == [4] and level.tokens == [1, 2, 3]
    ahead = _Cache([1, 2, 3, 4, 9])  # drafted past the history
    assert backlog(ahead, [1, 2, 3]) == [3] and ahead.tokens == [1, 2]
    parted = _Cache([1, 2, 7, 8])  # a rejected draft
    assert backlog(parted, [1, 2, 3, 4, 5]) == [3, 4, 5] and parted.tokens == [1, 2]
