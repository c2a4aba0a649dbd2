"""What a kind of draft has earned: the chance each draft position is accepted, learned from the drafts verified
and, for lookups, in hindsight from the whole proposal (the policy decides with it: policy.py).

Acceptance is not independent per token (a copied passage is either the right one, and then goes on, or not), so
per kind of draft the chance c_j that position j is accepted given every position before it was is learned, and
E[accepted | k] = Σ_{j<k} Π_{i≤j} c_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.speculative.shapes import Depths

DECAY = 0.95  # weight of the past in each running estimate
# c_0 before any evidence: a kind of draft has to earn trust. 0.5 made a short generation on a GPU, where a draft
# step costs ~30% more than a plain one, pay for drafts it never recovered (0.84x; 0.95x with 0.3: replay_tables.py)
PRIOR = 0.3
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each position's prior (the previous position's estimate)


@dataclass(slots=True)
class Survival:
    """Decayed counts of (reached, accepted) per draft position; a Beta prior links each position to the last."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    prior: float = PRIOR  # c_0 before any evidence

    def update(self, accepted: int, drafted: int) -> None:
        # positions after the first rejection were never tested: they say nothing
        for j in range(min(drafted, accepted + 1)):
            self.record(j, j < accepted)

    def record(self, j: int, accepted: bool) -> None:
        """Position j was reached (every position before it accepted) and was, or was not, accepted."""
        if j == len(self.reached):
            self.reached.append(0.0)
            self.accepted.append(0.0)
        self.reached[j] = self.reached[j] * DECAY + 1.0
        self.accepted[j] = self.accepted[j] * DECAY + (1.0 if accepted else 0.0)

    def expected_accepted(self, k: int) -> list[float]:
        """E[accepted] for every draft length 0..k: the sum over positions of the chance all up to it survive.

        c_j, the chance position j is accepted when all before it were, is estimated with c_{j-1} as its prior."""
        out, survive, total, c = [0.0], 1.0, 0.0, self.prior
        seen = len(self.reached)
        for j in range(k):
            n, a = (self.reached[j], self.accepted[j]) if j < seen else (0.0, 0.0)
            c = (a + PRIOR_WEIGHT * c) / (n + PRIOR_WEIGHT)
            survive *= c
            total += survive
            out.append(total)
        return out


@dataclass(slots=True)
class Watched:
    """A cheap draft's full proposal, compared token by token with what the target emits next.

    With several candidates, ``survivals[w - 1]`` learns how far the best of the first w of them runs (a tree of
    w branches), all widths from the same proposal."""

    candidates: list[list[int]]
    survivals: list[Survival]
    matched: int = 0
    alive: list[bool] = field(default_factory=list)  # the candidates that matched every token so far
    depths: Depths | None = None  # told each token the proposal got right (a device with pass shapes) ...
    born: int = 0  # ... as of the step it was made (depths' age)
    # the tokens a grammar forced before the proposal, which it was made after: skipped, not scored (the proposal
    # begins after them); a different token there, and the proposal's premise never held: nothing is scored
    after: tuple[int, ...] = ()
    skipped: int = 0  # of ``after``, seen emitted so far

    def advance(self, emitted: Sequence[int]) -> bool:
        """Score each position as soon as its token is known; True once the proposal is settled.

        Scoring positions as they come, not whole proposals once settled, matters: a mismatch settles at once
        while a proposal that keeps matching settles only after all its tokens, and counting only settled
        proposals would hear the failures of a long copy before its successes.
        """
        if not self.alive:
            self.alive = [True] * len(self.candidates)
        if self.skipped < len(self.after):  # the forced tokens it followed, checked once: not scored
            n = min(len(self.after) - self.skipped, len(emitted))
            if tuple(emitted[:n]) != self.after[self.skipped:self.skipped + n]:
                return True
            self.skipped += n
            emitted = emitted[n:]
        for token in emitted:
            j = self.matched
            reached = False  # some alive candidate among the first w reaches position j
            ok = False  # ... and holds the emitted token there
            alive = self.alive
            for w, candidate in enumerate(self.candidates):
                if alive[w] and j < len(candidate):
                    reached = True
                    alive[w] = candidate[j] == token
                    ok = ok or alive[w]
                else:
                    alive[w] = False
                if reached:
                    self.survivals[w].record(j, ok)
            if not ok:
                return True
            if self.depths is not None and alive[0]:
                self.depths.matched(j, self.depths.steps - self.born)
            self.matched += 1
        return not any(a and self.matched < len(c) for a, c in zip(self.alive, self.candidates, strict=True))
