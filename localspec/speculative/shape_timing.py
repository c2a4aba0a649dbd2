"""What a pass costs by where it stands in a GPU's graph warm-up: right after a change of size, while a graph is
captured, and steady (the same size repeated); measured per device, cached like the pass costs.

localspec's calibration interleaves sizes, so on a GPU every figure it takes is a pass without a CUDA graph (an
H100: 1 row 2.12 ms interleaved against 1.10 ms repeated). The policy needs both: the steady cost of the size it
keeps, and what a change costs (speculative/shapes.py). On a CPU there are no graphs and the three agree; it is
measured there only when asked (``localspec calibrate --shapes``), to show it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.engine import Context, Device
from localspec.speculative.calibrate import timed_pass, timing_history
from localspec.speculative.calibration_cache import cache_path, cached
from localspec.speculative.costs import low_quantile
from localspec.speculative.shapes import Shapes

SIZES = (1, 2, 4, 8, 9, 16, 17)  # powers of two, and past the small-batch kernels' limit (an H100's 8 → 9)
STAGES = ("after change", "capture", "steady")


@dataclass(frozen=True, slots=True)
class ShapeTiming:
    """Seconds per pass by stage ("after change", "capture", "steady") and size."""

    seconds: dict[str, dict[int, float]]

    def shapes(self, n_max: int) -> Shapes:
        """The sizes to keep, up to ``n_max`` rows (none where a change costs nothing)."""
        steady, after, capture = (self.seconds[stage] for stage in ("steady", "after change", "capture"))
        return Shapes.learn(steady, after, capture, n_max)

    def to_json(self) -> str:
        return json.dumps({stage: {str(n): s for n, s in by.items()} for stage, by in self.seconds.items()})


def measure_shapes(
    ctx: Context, sizes: Sequence[int] = SIZES, *, rounds: int = 3, cancelled: Callable[[], bool] | None = None,
) -> ShapeTiming:
    """Each size right after a pass of another size, then twice more (the capture, then a steady pass), over
    ``rounds`` rounds; a low quantile of each. The cache is left as it was found."""
    sizes = [n for n in sizes if n <= ctx.max_rows] or [1]
    samples: dict[str, dict[int, list[float]]] = {stage: {n: [] for n in sizes} for stage in STAGES}
    n_max = max(sizes)
    with timing_history(ctx, n_max + 1) as tokens:
        timed_pass(ctx, tokens[:1], ctx.backend_sampling, cancelled)  # the first pass allocates the graph
        for rep in range(rounds + 1):
            for n in sizes if rep % 2 else reversed(sizes):
                timed_pass(ctx, tokens[: n + 1 if n < n_max else n - 1], ctx.backend_sampling, cancelled)  # a change
                for stage in (*STAGES, "steady"):
                    seconds = timed_pass(ctx, tokens[:n], ctx.backend_sampling, cancelled)
                    if rep:  # the first round warms caches
                        samples[stage][n].append(seconds)
    return ShapeTiming({stage: {n: low_quantile(s) for n, s in by.items()} for stage, by in samples.items()})


def load_or_measure_shapes(
    ctx: Context, model_hash: str, device: Device, n_max: int, *, again: bool = False,
    say: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
) -> Shapes:
    """The pass sizes this device keeps (none without CUDA graphs: a CPU, an RPC setup, graphs disabled), from a
    timing cached per model and device, or taken now (a second or so on a GPU)."""
    timing = load_or_measure_timing(ctx, model_hash, device, again=again, say=say, cancelled=cancelled)
    return timing.shapes(n_max) if timing is not None else Shapes()


def load_or_measure_timing(
    ctx: Context, model_hash: str, device: Device, *, again: bool = False,
    say: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
) -> ShapeTiming | None:
    """``load_or_measure_shapes``'s timing: None where no CUDA graphs run (nothing is timed there)."""
    if not device.graphs or not ctx.model.can_rollback:
        return None
    return cached(cache_path(model_hash, device, len(SIZES), "shapes"), _read,
                  lambda: measure_shapes(ctx, cancelled=cancelled),
                  "timing passes of a steady size and after a change of size (CUDA graphs), once", again=again,
                  say=say)


def _read(path: os.PathLike[str]) -> ShapeTiming | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return ShapeTiming({stage: {int(n): float(s) for n, s in data[stage].items()} for stage in STAGES})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
