"""Drafting from a prediction: the text a client says the answer will mostly be (OpenAI's Predicted Outputs).

A prediction is read in order. The drafter keeps its place in it, an alignment between the answer and the
prediction, and drafts what follows that place. After a mismatch (the edit) it has no place: each step it looks for
where the answer's last tokens occur in the prediction, and drafts from there once the answer rejoins it. Near
the last place it knew wins over a longer match further away: an edit is local, and a file repeats itself.

It is a drafter of its own in the cascade, first, rather than a second source inside the n-gram drafter: the
prediction belongs to one generation, not to the sequence's text (its index would have to be built and dropped at
every request, and rolled back with it), it needs no index at all (a scan of one array after a mismatch), and its
kinds ("prediction/…") are learned apart by the policy and forgotten per generation (policy.DraftPolicy.restart).
Where it has been wrong, its proposals are trimmed to nothing, and the cascade's next drafter drafts as if it were
not there: a wrong prediction costs a lookup a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters.base import Draft
from localspec.events import PREDICTION_KIND

_MAX_N = 8  # the longest match of the answer's last tokens that is looked for
_TRUSTED = 3  # a match this long near the last place beats a longer one elsewhere


class PredictionDrafter:
    name = "prediction"
    lookup = True

    def __init__(self, prediction: Sequence[int]) -> None:
        self.tokens = np.asarray(prediction, dtype=np.int64)
        self._list = [int(t) for t in prediction]
        # the alignment: answer position i stands for prediction position i + offset (None: no place now)
        self._offset: int | None = None
        self._len = 0  # the accepted history's length, as last told
        self._last = 0  # the prediction position the answer last stood at: where a lost place is looked for
        self._proposed: tuple[int, int] | None = None  # the last proposal's alignment and where it was made
        # where the text parted from its place at its very last token: an edit of one token for another (a name, a
        # number) goes on as the prediction does after the token it replaced
        self._swap: int | None = None

    def begin(self, history: Sequence[int]) -> None:
        # the answer begins where the prediction does
        self._offset, self._len, self._last = -len(history), len(history), 0
        self._proposed = self._swap = None

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        self._proposed = None
        if cap <= 0 or not len(self._list):
            return Draft(drafter=self.name)
        n = len(history)
        offset, kind = self._offset, "follow"
        # past the accepted history (a grammar's forced tokens), the place holds only if they follow the prediction
        if offset is not None and not self._agrees(history, self._len, offset):
            offset = None
        if offset is None:
            found = self._find(history)
            if found is not None and (found[1] >= 2 or self._swap is None):
                offset, matched = found
                kind = f"{min(matched, 4)}{'+' if matched >= 4 else ''}"
            elif self._swap is not None and self._agrees(history, self._len, self._swap):
                offset, kind = self._swap, "swap"  # a longer match beats it: the edit was more than one token
            else:
                return Draft(drafter=self.name)
        start = n + offset
        if start >= len(self._list):
            return Draft(drafter=self.name)
        self._proposed = (offset, n)
        return Draft(self._list[start : start + cap], None, self.name, PREDICTION_KIND + kind)

    def _agrees(self, history: Sequence[int], since: int, offset: int) -> bool:
        """Whether ``history[since:]`` is the prediction's text at ``offset``."""
        end = len(history) + offset
        if since + offset < 0 or end > len(self._list):
            return False
        return list(history[since:]) == self._list[since + offset : end]

    def _find(self, history: Sequence[int]) -> tuple[int, int] | None:
        """The offset of the place the answer's last tokens point to, and how many of them match there: the longest
        match up to _TRUSTED, the nearest after the last known place among those."""
        p = self.tokens
        if not len(history) or len(p) < 2:
            return None
        ends = np.flatnonzero(p[:-1] == history[-1])  # the answer's last token, with something after it
        if not len(ends):
            return None
        matched = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for j in range(1, min(_MAX_N, len(history))):
            before = ends - j
            alive &= before >= 0
            alive[alive] &= p[before[alive]] == history[-1 - j]
            if not alive.any():
                break
            matched += alive
        score = np.minimum(matched, _TRUSTED)
        best = ends[score == score.max()]
        # the nearest at or after the last place; one before it only where none is after (wrapped around)
        distance = np.where(best >= self._last, best - self._last, len(p) + self._last - best)
        at = int(best[int(np.argmin(distance))])
        return at + 1 - len(history), int(matched[np.flatnonzero(ends == at)[0]])

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        since, self._len = self._len, len(history)
        # the text went on as the place said (followed), or as the last proposal's place said (found again)
        offsets = [o for o in (self._offset, self._proposed[0] if self._proposed else None) if o is not None]
        self._swap = None
        for offset in offsets:
            if self._agrees(history, since, offset):
                self._offset = offset
                self._last = len(history) + offset
                return
        self._offset = None
        # the place is lost where the text parted from it: a place is looked for after there, not before it again
        for offset in offsets:
            parted = self._parted(history, since, offset)
            self._last = max(self._last, parted)
            if parted == len(history) - 1 + offset and self._swap is None:  # only its last token differed
                self._swap = offset

    def _parted(self, history: Sequence[int], since: int, offset: int) -> int:
        """The prediction position where ``history[since:]``, read at ``offset``, stops following it."""
        at = since + offset
        if at < 0:
            return 0
        for token in history[since:]:
            if at >= len(self._list) or self._list[at] != token:
                break
            at += 1
        return at

    def close(self) -> None:
        self._list = []
