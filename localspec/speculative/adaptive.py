"""Choose the draft length each step to maximise expected tokens per second.

With a per-token acceptance probability a, a draft of k tokens yields E[k] = (1 − a^(k+1)) / (1 − a) tokens
per target pass (accepted prefix + the target's own token). A pass costs verify(k+1) + k · draft_per_token.
Both acceptance (per drafter and per draft kind, e.g. n-gram match length) and costs are measured as the run
goes, with exponential decay so the choice follows the text. k = 0 is a plain decoding step: a drafter that
does not pay for itself is switched off, and probed now and then in case the text turns predictable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.drafters.base import Draft, Drafter

_DECAY = 0.9  # weight of the past in each running estimate
_PROBE_EVERY = 16  # plain steps before a drafter that lost its place is tried again with k = 1


@dataclass(slots=True)
class _Acceptance:
    hits: float = 1.0  # prior: a coin flip
    trials: float = 2.0

    @property
    def rate(self) -> float:
        return self.hits / self.trials

    def update(self, accepted: int, drafted: int) -> None:
        # positions after the first rejection were never tested: they say nothing about acceptance
        tested = min(drafted, accepted + 1)
        self.hits = self.hits * _DECAY**tested + accepted
        self.trials = self.trials * _DECAY**tested + tested


@dataclass(slots=True)
class _VerifyCost:
    """verify(n) ≈ base + per_token · (n − 1): one batched target pass over n tokens."""

    base: float = 0.0
    per_token: float = 0.0
    seen: dict[int, float] = field(default_factory=dict)

    def update(self, n: int, seconds: float) -> None:
        old = self.seen.get(n)
        self.seen[n] = seconds if old is None else _DECAY * old + (1 - _DECAY) * seconds
        ones = self.seen.get(1)
        if ones is not None:
            self.base = ones
        wide = [(m, t) for m, t in self.seen.items() if m > 1]
        if wide and self.base > 0:
            slopes = [(t - self.base) / (m - 1) for m, t in wide]
            self.per_token = max(0.0, sum(slopes) / len(slopes))
        elif self.base > 0 and self.per_token == 0.0:
            self.per_token = 0.2 * self.base  # measured order of magnitude on CPU before any batch is seen

    def __call__(self, n: int) -> float:
        return self.seen.get(n, self.base + self.per_token * (n - 1))


class AdaptiveK:
    """Picks k per step; ``fixed`` pins it (``--k N``)."""

    def __init__(self, k_max: int = 16, fixed: int | None = None) -> None:
        self.k_max = k_max
        self.fixed = fixed
        self.reset()

    def reset(self) -> None:
        """Forget what was learned (acceptance and costs); drafters holding this chooser keep using it."""
        self._acceptance: dict[str, _Acceptance] = {}
        self._draft_cost: dict[str, float] = {}  # seconds per drafted token, per drafter
        self._verify = _VerifyCost()
        self._plain_steps: dict[str, int] = {}

    def acceptance(self, key: str) -> float:
        return self._acceptance.setdefault(key, _Acceptance()).rate

    def best_k(self, key: str, drafter: str, limit: int | None = None) -> int:
        """The k that maximises expected tokens per second for drafts of kind ``key``."""
        cap = self.k_max if limit is None else min(limit, self.k_max)
        if self.fixed is not None:
            return min(self.fixed, cap)
        if self._verify.base <= 0.0:
            return min(4, cap)  # no costs measured yet: a modest draft measures them
        a = min(self.acceptance(key), 0.999)
        d = self._draft_cost.get(drafter, 0.0)
        best_k, best_rate = 0, 1.0 / self._verify(1)
        expected = 1.0
        for k in range(1, cap + 1):
            expected += a**k
            rate = expected / (self._verify(k + 1) + k * d)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and cap > 0:
            waited = self._plain_steps.get(drafter, 0) + 1
            self._plain_steps[drafter] = waited
            if waited >= _PROBE_EVERY:
                self._plain_steps[drafter] = 0
                return 1
        return best_k

    def observe(
        self, key: str, drafter: str, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float
    ) -> None:
        self._verify.update(drafted + 1, verify_seconds)
        if drafted:
            self._acceptance.setdefault(key, _Acceptance()).update(accepted, drafted)
            per_token = draft_seconds / drafted
            old = self._draft_cost.get(drafter)
            self._draft_cost[drafter] = per_token if old is None else _DECAY * old + (1 - _DECAY) * per_token

    def plain_seconds_per_token(self) -> float:
        """What one plain decoding step costs, as measured (0 before any step)."""
        return self._verify(1) if self._verify.base > 0 else 0.0

    def expected_speedup(self, key: str, drafter: str, k: int) -> float:
        """Tokens/s with drafts of length k relative to plain decoding, from the current estimates."""
        if self._verify.base <= 0.0 or k <= 0:
            return 1.0
        a = min(self.acceptance(key), 0.999)
        expected = sum(a**i for i in range(k + 1))
        cost = self._verify(k + 1) + k * self._draft_cost.get(drafter, 0.0)
        return expected / cost * self._verify(1)


def draft_for(drafter: Drafter, history: Sequence[int], room: int, chooser: AdaptiveK) -> Draft:
    """Ask ``drafter`` for the draft length that pays best, never more than ``room`` tokens."""
    if room <= 0:
        return Draft(drafter=drafter.name)
    if drafter.cheap:  # look first (free), then keep as much as the match kind has earned
        draft = drafter.propose(history, min(room, chooser.k_max))
        if draft.tokens and not draft.sized:
            return draft.trimmed(chooser.best_k(draft.key, draft.drafter, len(draft)))
        return draft
    k = chooser.best_k(drafter.name, drafter.name, room)
    return drafter.propose(history, k) if k else Draft(drafter=drafter.name, key=drafter.name)
