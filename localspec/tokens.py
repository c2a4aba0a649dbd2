"""Token sequences: a ground-floor helper that every layer may use (the engine, the loop, the scheduler, drafters)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def longest_held(lanes: Any, me: int, tokens: Sequence[int], scope: str | None,
                 among: int | None = None) -> tuple[int, int]:
    """The one prefix search over (scope, tokens), for the scheduler's lanes and the draft phase's: the lane other
    than ``me``, of the first ``among`` (all where None), that holds the longest start of ``tokens`` in its cache and
    belongs to ``scope`` (a prefix is never shared across scopes; a lane without one has None). Returns (its length,
    that lane) where it holds more than ``me`` does, else (what ``me`` holds, -1)."""
    best, source = len(lanes[me].tokens), -1
    for other in range(len(lanes) if among is None else among):
        n = held(lanes[other], tokens, scope) if other != me else 0
        if n > best:
            best, source = n, other
    return best, source


def held(lane: Any, tokens: Sequence[int], scope: str | None) -> int:
    """How much of ``tokens`` a request of ``scope`` may take from ``lane``'s cache: its common start, nothing across
    scopes (a lane's scope is its own, set when a job starts on it; a lane without one has None)."""
    return common_prefix(lane.tokens, tokens) if getattr(lane, "scope", None) == scope else 0
