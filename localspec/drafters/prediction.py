"""Drafting from a prediction: the text a client says the answer will mostly be (OpenAI's Predicted Outputs).

A prediction is read in order. The drafter keeps its place in it, an alignment between the answer and the
prediction, and drafts what follows that place. After a mismatch (the edit) it has no place: each step it looks for
where the answer's last tokens occur in the prediction, and drafts from there once the answer rejoins it. Near
the last place it knew wins over a longer match further away: an edit is local, and a file repeats itself.

It is a drafter of its own in the cascade, first, rather than a second source inside the n-gram drafter: the
prediction belongs to one generation, not to the sequence's text (its index would have to be built and dropped at
every request, and rolled back with it), it needs no index at all (a scan of one array after a mismatch), and its
kinds ("prediction/…") are learned apart by the policy and forgotten per generation (policy.DraftPolicy.restart).
Where it has been wrong, the adaptive policy trims its proposals to nothing, and the cascade's next drafter drafts
as if it were not there: a wrong prediction costs a lookup a step. Where the draft length is pinned (``--k``) or a
GPU's kept pass size sets it, what it proposes is drafted: so it proposes only from a place it holds, a place
found again on two tokens or more, or one token right after where it was (a line put in), and nothing past the
prediction's end. A ranking of its proposal against the other lookups', one trim a step, is the deeper fix
(policy.DraftPolicy.trim ranks two sources today).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters.base import Draft, match_bucket
from localspec.drafters.ngram import NEAR_TRUSTED
from localspec.events import PREDICTION_KIND
from localspec.tokens import common_prefix

_MAX_N = 8  # the longest match of the answer's last tokens that is looked for
_NEAR = 16  # how far after the last held place a one-token match may be


class PredictionDrafter:
    name = "prediction"
    lookup = True

    def __init__(self, prediction: Sequence[int]) -> None:
        self._array = np.asarray(prediction, dtype=np.int64)  # scanned for a lost place
        self._list = [int(t) for t in prediction]  # sliced for drafts, compared a block at a time (common_prefix)
        # the alignment: answer position i stands for prediction position i + offset (None: no place now)
        self._offset: int | None = None
        self._len = 0  # the accepted history's length, as last told
        self._last = 0  # where in the prediction the next token stood when the place was last held: looked for there
        self._proposed: int | None = None  # the last proposal's alignment
        # where the text parted from its held place at its very last token: an edit of one token for another (a name,
        # a number) goes on as the prediction does after the token it replaced
        self._swap: int | None = None

    def begin(self, history: Sequence[int]) -> None:
        # the answer begins where the prediction does
        self._offset, self._len, self._last = -len(history), len(history), 0
        self._proposed = self._swap = None

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        self._proposed = None
        n = len(history)
        if cap <= 0 or self._last >= len(self._list):  # the answer has gone past the prediction's end
            return Draft(drafter=self.name)
        offset, kind = self._offset, "follow"
        # past the accepted history (a grammar's forced tokens), the place holds only if they follow the prediction
        if offset is not None and not self._agrees(history, self._len, offset):
            offset = None
        if offset is None:
            found = self._find(history)
            if self._swap is not None and (found is None or found[1] < 2) and self._agrees(history, self._len,
                                                                                           self._swap):
                offset, kind = self._swap, "swap"  # a longer match beats it: the edit was more than one token
            elif found is not None:
                offset, kind = found[0], match_bucket(found[1])
            else:
                return Draft(drafter=self.name)
        start = n + offset
        if start >= len(self._list):
            return Draft(drafter=self.name)
        self._proposed = offset
        return Draft(self._list[start : start + cap], None, self.name, PREDICTION_KIND + kind)

    def _followed(self, history: Sequence[int], since: int, offset: int) -> int:
        """How many of ``history[since:]`` follow the prediction read at ``offset``."""
        at = since + offset
        if at < 0:
            return 0
        return common_prefix(history[since:], self._list[at:])

    def _agrees(self, history: Sequence[int], since: int, offset: int) -> bool:
        """Whether all of ``history[since:]`` is the prediction's text at ``offset``."""
        return self._followed(history, since, offset) == len(history) - since

    def _find(self, history: Sequence[int]) -> tuple[int, int] | None:
        """The offset of the place the answer's last tokens point to, and how many of them match there: the longest
        match up to NEAR_TRUSTED, the nearest after the last held place among those. One token alone is a place only
        right after the last held one (a line put in, then the prediction's again): elsewhere it is a guess that
        costs a pass wherever the draft length is pinned."""
        p = self._array
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
        starts = ends + 1  # where a draft from each would begin
        # how far each is from the last held place, forward; one before it counts past every one after it
        distance = np.where(starts >= self._last, starts - self._last, len(p) + self._last - starts)
        ok = (matched >= 2) | (distance <= _NEAR)
        if not ok.any():
            return None
        score = np.where(ok, np.minimum(matched, NEAR_TRUSTED), 0)
        best = np.flatnonzero(score == score.max())
        at = best[int(np.argmin(distance[best]))]
        return int(starts[at]) - len(history), int(matched[at])

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        since, self._len = self._len, len(history)
        proposed, self._proposed, self._swap = self._proposed, None, None
        # the text went on as the held place said (followed), or as the last proposal's place said (found again)
        for offset in dict.fromkeys(o for o in (self._offset, proposed) if o is not None):
            if self._agrees(history, since, offset):
                self._offset = offset
                self._last = len(history) + offset
                return
        held, self._offset = self._offset, None
        if held is not None:  # a guess that failed says nothing of where the text is: only the held place moves
            parted = since + held + self._followed(history, since, held)
            self._last = max(self._last, parted)
            if parted == len(history) - 1 + held:  # only its last token differed
                self._swap = held

    def close(self) -> None:
        self._list = []
