"""The pass sizes one sequence keeps on a device with pass shapes (a GPU's CUDA graphs are replayed only while a pass's
size stays the same: speculative/shapes.py): which kept size this step's pass has, how a draft is padded up to it,
and when one draft may leave it for a longer pass. A part of the draft-length policy (``DraftPolicy`` is one), kept
apart from the choosing of lengths; a batch's pass size is the scheduler's (speculative/batch_size.py)."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.drafters.base import Draft
from localspec.speculative.shapes import Depths, Shapes, choose, pad, stretch
from localspec.speculative.survival import Survival

# A longer pass for one draft (shapes.stretch) goes only as deep as its kind has been checked this often (decayed):
# 4 left it never taken on the replayed suites; none bet 16 rows on a kind only ever checked 2 deep
_STRETCH_EVIDENCE = 2.0


class PassSizes:
    """Pass-size keeping for a sequence's policy: what it reads of the policy is declared here."""

    k_max: int
    fixed: int | None
    shapes: Shapes
    size: int  # the kept size of this sequence's passes (0: none chosen yet)
    depths: Depths | None
    in_batch: bool
    expected: float
    _room: int
    _proposal: list[int]
    _step_depth: int | None
    _trimmed: Draft | None
    _draft_cost: dict[str, float]

    @property
    def keeps_size(self) -> bool:
        """The mode a sequence's passes are sized in: its own kept size, on a device with pass shapes, alone; in a
        batch (``in_batch``, which the scheduler sets) it only drafts, and the scheduler keeps the pass's size
        (speculative/batch_size.py), telling ``pad`` how far to go. Without pass shapes, neither."""
        return self.depths is not None and not self.in_batch

    def _survival_of(self, kind: str) -> Survival:
        raise NotImplementedError

    def _rate_seconds(self, rows: int) -> float:
        raise NotImplementedError

    def pad(self, draft: Draft, history: Sequence[int], room: int, depth: int | None = None) -> Draft:
        """On a device with pass shapes, a chain (or no draft) filled up to the kept size, or to ``depth`` (a
        batch's scheduler says), at most ``room`` tokens: a lookup's with the rest of its proposal, then filler; a
        model's greedy draft that stopped short (--p-min) with filler (a sampled one is left as drawn). Elsewhere,
        and in a batch until the scheduler says how far: ``draft`` as is. One sequence's step is counted here too,
        with or without a proposal (Depths' clock)."""
        if self.depths is None or (not self.keeps_size and depth is None):
            return draft
        lookup = not draft.tokens or draft is self._trimmed
        made = self._proposal  # this step's lookup proposal (``trim`` counted the step)
        proposal = made if lookup else []
        if depth is None:
            if not made:
                self.depths.record()  # a step with no lookup proposal: every depth would have made 1 token
            depth = self._step_depth if self._step_depth is not None else self._depth()
        self._proposal, self._step_depth = [], None
        depth = min(depth, room)
        if draft.dists is not None or draft.others or len(draft) >= depth:
            return draft
        tokens = pad(draft.tokens, proposal, history, depth)
        filler = depth - max(len(draft), min(len(proposal), depth))
        padded = Draft(tokens, None, draft.drafter, draft.kind or "pad", filler=filler, forced=draft.forced)
        if lookup:  # learned in hindsight (its proposal), or filler: never as a draft of its own
            self._trimmed = padded
        return padded

    def _depth(self, draft: Draft | None = None) -> int:
        """Draft tokens in this step's pass, on a device with pass shapes: the kept size, less the pending row, or,
        for one pass, as much of ``draft`` as its kind's record says is worth leaving the kept size for."""
        shapes, depths = self.shapes, self.depths
        assert depths is not None
        # a pinned k: its length padded up to a kept size, or 1 row while no proposal has run far enough to pay for
        # those rows (a generation's start, a dry spell); forcing the size from the first step replayed slower
        if self.fixed is not None:
            sizes = [1, self._pinned_size(min(self.fixed, self.k_max))]
            depths.track(sizes[1] - 1)
        else:
            sizes = [s for s in shapes.sizes if s <= self.k_max + 1]
        self.size = choose(self.size, sizes, lambda s: (depths.expected(s - 1), self._rate_seconds(s)),
                           shapes.change_cost, self._room)
        if draft is None or self.fixed is not None:
            return self.size - 1
        return self._burst(draft, self.size - 1)

    def _pinned_size(self, k: int) -> int:
        """The pass a pinned k is verified in on a device with pass shapes: the kept size that holds it (--k k_max:
        past the largest kept size its own, never past k_max + 1 rows)."""
        return min(self.shapes.size_for(k + 1), self.k_max + 1)

    def _model_depth(self, drafter: str, room: int, k: int) -> int:
        """A model draft's length where the device keeps pass sizes: best_k's ``k`` (the best length, or a probe's),
        a kept size, or the length it had, kept until another pays for the change (shapes.choose), each drafted
        token's own cost counted. (Offering kept sizes alone rounded a weak draft model's marginal k = 1 up to 4
        rows, slower than no draft; with a good one that did better: tools/toy_draft_model.py.)"""
        top = min(room, self.k_max) + 1
        sizes = sorted({k + 1, *(s for s in (*self.shapes.sizes, self.size) if 1 < s <= top)})
        expected = self._survival_of(drafter).expected_accepted(sizes[-1] - 1)
        per_token = self._draft_cost.get(drafter, 0.0)
        self.size = choose(self.size, sizes,
                           lambda s: (1.0 + expected[s - 1], self._rate_seconds(s) + (s - 1) * per_token),
                           self.shapes.change_cost, self._room)
        self.expected = 1.0 + expected[self.size - 1]
        return self.size - 1

    def _burst(self, draft: Draft, depth: int) -> int:
        """``depth``, or longer for this pass alone where the kind has run far enough before (shapes.stretch)."""
        survival = self._survival_of(draft.kind)
        # only as deep as the kind has been checked: past that its estimate is the last position's, again and again
        seen = next((j for j, r in enumerate(survival.reached) if r < _STRETCH_EVIDENCE), len(survival.reached))
        n = min(len(draft), self.k_max, self._room, seen)
        if n <= depth:
            return depth
        assert self.depths is not None  # (called from _depth only)
        return stretch(depth, survival.expected_accepted(n), self._rate_seconds, self.shapes,
                       self.depths.expected(depth))

    def spare(self) -> int:
        """In a batch, the tokens of this step's proposal that its draft left out: the first rows worth padding."""
        trimmed = len(self._trimmed) if self._trimmed is not None else 0
        return max(0, len(self._proposal) - trimmed)
