"""The pass size a batch keeps on a device with pass shapes (a GPU's CUDA graphs want it steady: speculative/shapes.py):
the scheduler's rows padded, pass after pass, where the padding costs less than the change of size it saves. One
sequence's passes keep theirs in its policy (DraftPolicy.pad)."""

from __future__ import annotations

from localspec.speculative.costs import PassCosts
from localspec.speculative.flight import Flight
from localspec.speculative.shapes import Shapes


class BatchSize:
    """The rows of a batch's last pass, padding included, and how the next pass is padded."""

    def __init__(self, costs: PassCosts, max_rows: int) -> None:
        self.costs = costs  # the batch's shared pass costs
        self.max_rows = max_rows  # outputs one pass may have
        self.last = 0

    def fill(self, planned: list[Flight], shapes: Shapes, rows: int) -> int:
        """Pad the pass up to the number of rows the last pass had, or up to a kept size, where the padding costs
        less than the change of size it saves (a GPU's CUDA graphs want the size steady): first with the rest of
        the sequences' proposals (rows with a chance), then filler spread evenly. Returns the rows."""
        last = self.last
        sizes = {rows, shapes.size_for(rows), *([last] if last >= rows else [])}
        # seeded sampled sequences alone: priced as they price their drafts (frozen), not on live timings
        frozen = all(f.generator.policy.reproducible for f in planned)
        costs = planned[0].generator.policy.costs if frozen else self.costs

        def price(size: int) -> float:
            return costs(size) + (0.0 if size == last else shapes.change_cost(size))

        size = min((s for s in sizes if s <= self.max_rows), key=lambda s: (price(s), s), default=rows)
        self.last = rows
        if size <= rows:
            return rows
        extra = size - rows
        depth = {id(f): len(f.plan.rows) - 1 for f in planned
                 if f.plan is not None and f.plan.parents is None and f.generator.drafters and f.room > 0}
        for f in sorted(planned, key=lambda f: -f.generator.policy.spare()):
            if id(f) in depth:
                take = min(extra, f.generator.policy.spare(), f.room - depth[id(f)])
                depth[id(f)] += take
                extra -= take
        padable = [f for f in planned if id(f) in depth]
        while extra > 0 and padable:  # filler, spread evenly over the sequences with room for it
            padable = [f for f in padable if depth[id(f)] < f.room]
            for f in padable[:extra]:
                depth[id(f)] += 1
                extra -= 1
        for f in planned:
            if id(f) in depth and f.plan is not None:
                f.plan = f.generator.widen(f.plan, f.run.history, depth[id(f)], f.room)
        self.last = sum(len(f.plan.rows) for f in planned if f.plan is not None)
        return self.last
