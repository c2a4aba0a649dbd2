"""Token sequences: a ground-floor helper that every layer may use (the engine, the loop, the scheduler, drafters)."""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any, Protocol

_BLOCK = 64  # tokens compared a slice at a time (in C) before the last, partial block is walked in Python


class Cache(Protocol):
    """A sequence's cache as a draft context or a draft lane keeps it: the tokens it holds, and a rollback."""

    @property
    def tokens(self) -> Sequence[int]: ...

    def truncate(self, n: int) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start. Lists (the caches' and histories' type) are compared
    a block at a time: a prompt of thousands of tokens is a few dozen slice comparisons, not a Python loop over it."""
    n = min(len(a), len(b))
    i = 0
    if type(a) is type(b) is list:
        if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # the shorter one is not copied
            return n
        while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
            i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def backlog(cache: Cache, history: Sequence[int]) -> Sequence[int]:
    """Roll ``cache`` back to where it still agrees with ``history``, keeping at least the history's last token to
    decode (its logits are the next draft's first row); returns what it must decode to stand after ``history``. The
    one catch-up of a draft model's context (drafters/model.py) and of a draft lane (speculative/draft_phase.py)."""
    tokens = cache.tokens
    n = len(tokens)
    if n >= len(history) or (n and tokens[n - 1] != history[n - 1]):
        cache.truncate(min(common_prefix(tokens, history), len(history) - 1))
    return history[len(cache.tokens) :]


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


# past this many pairs of tokens, difflib's popular-token heuristic bounds the alignment's work: without it, a
# prediction and an answer of one repeated token cost every pair (8,192 x 8,192: minutes, on the thread every
# sequence's passes run on)
_EXACT_PAIRS = 4_000_000


def in_order(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens of ``a`` appear in ``b`` in the same order (the matching blocks of difflib's alignment):
    OpenAI's accepted prediction tokens, with ``a`` the prediction and ``b`` the answer. Exact up to _EXACT_PAIRS;
    beyond, tokens frequent in the answer start no block of their own (difflib's autojunk), so a count may be low."""
    if not a or not b:
        return 0
    matcher = SequenceMatcher(None, a, b, autojunk=len(a) * len(b) > _EXACT_PAIRS)
    return sum(block.size for block in matcher.get_matching_blocks())
