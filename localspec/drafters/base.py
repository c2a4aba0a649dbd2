"""The Drafter protocol (llama.cpp's begin/draft/accept shape).

A drafter sees only the accepted token history; it never touches the target's context. "No draft" (an empty
``Draft``) is a normal answer: the loop then does a plain decoding step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from localspec.sampling import Distribution


@dataclass(frozen=True, slots=True)
class Draft:
    """Proposed token ids; ``dists`` holds q for each token where the drafter sampled it from a distribution."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Distribution] | None = None
    drafter: str = ""
    key: str = ""  # what the adaptive chooser learns acceptance under (e.g. "ngram/3": a 3-token match)
    sized: bool = False  # the length was already chosen for cost (a model drafter's k); do not trim again
    watched: bool = False  # the untrimmed proposal is learned in hindsight (AdaptiveK.watch), not from the verdict

    def __len__(self) -> int:
        return len(self.tokens)

    def trimmed(self, k: int) -> Draft:
        if k >= len(self.tokens):
            return self
        dists = self.dists[:k] if self.dists is not None else None
        return replace(self, tokens=self.tokens[:k], dists=dists)


class Drafter(Protocol):
    name: str
    # cheap: proposing the longest draft costs nothing (a lookup), so look first and trim afterwards;
    # otherwise every drafted token costs a forward pass and k is chosen before proposing
    cheap: bool

    def begin(self, history: Sequence[int]) -> None:
        """A new generation starts from ``history`` (which may share a prefix with the previous one)."""

    def propose(self, history: Sequence[int], k: int) -> Draft:
        """Up to k tokens likely to follow ``history``."""

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        """The step kept ``n_accepted`` draft tokens; ``history`` is the accepted history after the step."""

    def close(self) -> None:
        """Free what the drafter holds (model contexts)."""
