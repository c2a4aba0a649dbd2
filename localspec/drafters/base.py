"""The Drafter protocol (llama.cpp's begin/draft/accept shape): a drafter only proposes.

A drafter sees only the accepted token history; it never touches the target's context, and how many tokens it
drafts is the policy's choice (speculative/policy.py), given as a cap. "No draft" (an empty ``Draft``) is a
normal answer: the loop then does a plain decoding step. A ``Verdict`` is what verification made of a draft
(speculative/verify.py, and a grammar's own verify in structured/constraint.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from localspec.sampling import Distribution

# the kind (and drafter) of a grammar's forced tokens (structured/constraint.py): learned apart from any drafter's
FORCED = "forced"


def match_bucket(n: int) -> str:
    """A lookup's kind by the length of the match it rests on: "1", "2", "3", "4+" (learned apart: policy.py)."""
    return f"{min(n, 4)}{'+' if n >= 4 else ''}"


@dataclass(frozen=True, slots=True)
class Draft:
    """Proposed token ids; ``dists`` holds q for each token where the drafter sampled it from a distribution."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Distribution] | None = None
    drafter: str = ""
    kind: str = ""  # what the proposal rests on (e.g. "ngram/3": a 3-token match); acceptance is learned per kind
    # further candidate continuations, best first (a lookup's other matches; one-hot, never with dists): the loop
    # verifies them together with ``tokens`` as a token tree, in the same pass
    others: tuple[list[int], ...] = ()
    # trailing tokens that are no proposal at all, only padding up to a GPU's kept pass size: verified like the rest
    # (so the text is unchanged) but not counted as drafted where the target rejects them
    filler: int = 0
    # a lookup's other proposal from another source (earlier requests', or the sequence's own): the policy puts
    # first the one whose kind has earned more, and learns the other in hindsight (policy.DraftPolicy.trim)
    fallback: Draft | None = None
    # leading tokens that a grammar forces (structured/constraint.py): verified like the rest, counted apart
    forced: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def candidates(self) -> list[list[int]]:
        return [self.tokens, *self.others] if self.tokens else []

    def trimmed(self, k: int, width: int = 1) -> Draft:
        """The first ``width`` candidates, each cut to ``k`` tokens."""
        if width > len(self.others) and all(k >= len(c) for c in self.candidates):
            return self
        dists = self.dists[:k] if self.dists is not None else None
        others = tuple(c[:k] for c in self.others[: width - 1])
        return replace(self, tokens=self.tokens[:k], dists=dists, others=others, forced=min(self.forced, k))


class Drafter(Protocol):
    name: str
    # lookup: proposing the longest draft costs nothing, so the policy lets it propose all it can and trims
    # afterwards; otherwise every drafted token costs a forward pass and the policy caps it before proposing
    lookup: bool

    def begin(self, history: Sequence[int]) -> None:
        """A new generation starts from ``history`` (which may share a prefix with the previous one)."""

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        """Up to ``cap`` tokens likely to follow ``history`` (a model drafter may stop early, never go past); a
        lookup may add up to ``width`` - 1 other candidates (``Draft.others``), a model drafter ignores ``width``."""

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        """The step kept ``n_accepted`` draft tokens; ``history`` is the accepted history after the step;
        ``verified``: how many candidates the pass verified (a tree's branches)."""

    def close(self) -> None:
        """Free what the drafter holds (model contexts)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """How many draft tokens survive, and the token the target adds after them (correction or bonus); for a token
    tree, ``path`` holds the accepted nodes (a chain's are its first ``n_accepted`` tokens)."""

    n_accepted: int
    token: int
    path: tuple[int, ...] | None = None

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.path if self.path is not None else tuple(range(self.n_accepted))
