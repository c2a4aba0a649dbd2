"""A GPU's kept pass sizes and pass costs forced on the real model on this CPU: what the policy, the loop and the
scheduler do on a device with CUDA graphs (padded passes, a pinned k's choice between 1 row and its size) runs here,
on the real llama.cpp, without a GPU. The figures are what `localspec calibrate --shapes` measured on an NVIDIA H200
on 2026-11-26 (../shared/gpu/h200-2026-11-26/shapes.txt): it keeps 1, 4, 8 and 16 rows, and a pass of 16 costs 2.9
of 1 (a CPU's costs make long drafts rarely pay, and a pinned k = 15 would never leave 1 row here)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import localspec.opening
import localspec.runtime
from localspec.speculative.calibration_cache import Calibration
from localspec.speculative.shape_timing import ShapeTiming
from localspec.speculative.shapes import Shapes

MS = 1e-3
H200 = ShapeTiming({
    "steady": {1: 0.99 * MS, 2: 1.11 * MS, 4: 1.34 * MS, 8: 1.60 * MS, 9: 2.40 * MS, 16: 2.73 * MS, 17: 2.90 * MS},
    "after change": {1: 2.18 * MS, 2: 2.47 * MS, 4: 2.58 * MS, 8: 2.76 * MS, 9: 3.37 * MS, 16: 3.56 * MS,
                     17: 3.70 * MS},
    "capture": {1: 1.83 * MS, 2: 2.91 * MS, 4: 3.08 * MS, 8: 3.30 * MS, 9: 4.72 * MS, 16: 5.04 * MS, 17: 4.31 * MS},
})

# the calibration there, ms by rows 1..17 (sizes interleaved, each steady)
H200_PASS_MS = (0.99, 1.18, 1.31, 1.38, 1.45, 1.53, 1.59, 1.63, 2.55, 2.65, 2.71, 2.74, 2.78, 2.81, 2.82, 2.84, 2.90)


def h200_calibration(n_max: int) -> Calibration:
    seconds = {n: H200_PASS_MS[min(n, len(H200_PASS_MS)) - 1] * MS for n in range(1, n_max + 1)}
    return Calibration(seconds, {}, "NVIDIA H200 (forced on this machine by the tests)")


@contextmanager
def forced_kept_sizes(timing: ShapeTiming = H200) -> Iterator[Shapes]:
    """While open, every runtime opened (one sequence or a batch) keeps ``timing``'s sizes and prices passes as the
    H200 did (nothing is written to the calibration cache)."""

    def kept(opening: object, ctx: object, n_max: int) -> Shapes:
        return timing.shapes(n_max)

    def costs(ctx: object, model_hash: str, device: object, n_max: int, **_: object) -> Calibration:
        return h200_calibration(n_max)

    def target_costs(opening: object, ctx: object, n_max: int, **_: object) -> Calibration:
        return h200_calibration(n_max)

    with pytest.MonkeyPatch.context() as mp:
        # the target's figures, as both runtimes open it (opening.Opening), and a sequence's calibration after
        mp.setattr(localspec.opening.Opening, "shapes", kept)
        mp.setattr(localspec.opening.Opening, "pass_costs", target_costs)
        mp.setattr(localspec.runtime, "load_or_measure", costs)
        shapes = timing.shapes(17)
        assert shapes.active, "the forced timing keeps no sizes: the fixture would test a CPU's path"
        yield shapes
