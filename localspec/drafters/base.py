"""The Drafter protocol (llama.cpp's begin/draft/accept shape): a drafter only proposes.

A drafter sees only the accepted token history; it never touches the target's context, and how many tokens it
drafts is the policy's choice (speculative/policy.py), given as a cap. "No draft" (an empty ``Draft``) is a
normal answer: the loop then does a plain decoding step.
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
    kind: str = ""  # what the proposal rests on (e.g. "ngram/3": a 3-token match); acceptance is learned per kind

    def __len__(self) -> int:
        return len(self.tokens)

    def trimmed(self, k: int) -> Draft:
        if k >= len(self.tokens):
            return self
        dists = self.dists[:k] if self.dists is not None else None
        return replace(self, tokens=self.tokens[:k], dists=dists)


class Drafter(Protocol):
    name: str
    # lookup: proposing the longest draft costs nothing, so the policy lets it propose all it can and trims
    # afterwards; otherwise every drafted token costs a forward pass and the policy caps it before proposing
    lookup: bool

    def begin(self, history: Sequence[int]) -> None:
        """A new generation starts from ``history`` (which may share a prefix with the previous one)."""

    def propose(self, history: Sequence[int], cap: int) -> Draft:
        """Up to ``cap`` tokens likely to follow ``history`` (a model drafter may stop early, never go past)."""

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        """The step kept ``n_accepted`` draft tokens; ``history`` is the accepted history after the step."""

    def close(self) -> None:
        """Free what the drafter holds (model contexts)."""
