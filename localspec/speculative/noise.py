"""How far this device's numerics move the target's logits with the shape of the pass that computes them: the margin
that tells a near-tie from a real divergence in the lossless check (bench/compare.py).

Target-only decoding computes each token in a pass of 1 row; speculation verifies it inside a pass of k + 1 rows (on a
GPU, one of the kept sizes: 4, 8, 16); the check re-scores prompt + prefix as one prefill and compares the two
candidates there. Each runs other kernels (llama.cpp's small-batch kernels cover up to 8 rows on CUDA), so a pair of
candidates can swap places between paths when their logits are close. The margin is measured, per model and device,
as the largest change of a top-5 pair's logit difference between the prefill the check scores with and a decode of
the same text in passes of 1, 4, 8 and 16 rows: a divergence whose gap (on the check's path) is within it may be two
paths ranking a near-tie differently; beyond it, it may not. A gap measured again on target-only's own path (1 row a
pass) has its own margin, the swing between a pass of 1 row and the verifying sizes. On an H200 (2026-11-27) a 1-row
pass and the prefill ranked top-5 pairs up to 4.2 logits apart (a 16-row pass and the prefill 0.66: the same
kernels); on an AMD EPYC, 0.7. Cached beside the device's calibration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from localspec.engine import Context
from localspec.engine.device import Device
from localspec.speculative.calibration_cache import cache_path, cached

# the margin measured on a CPU (Gemma 3 270M Q4_K_M, 2 threads; docs/architecture.md, "Numerics"): what a check uses
# where this device's own was not measured
DEFAULT_MARGIN = 1.1
# a pass of one row (target-only), and the verifying passes a GPU keeps: up to its small-batch kernels' limit, past it
ROWS = (1, 4, 8, 16)
TOP = 5
# the texts the noise is measured on: the target's own greedy continuations of a prose-and-list prompt and a code one
PROMPTS = ("Write a short recipe for tomato soup, with a list of ingredients and numbered steps.\n",
           "def add(a, b):\n    return a + b\n\n# The same function, renamed to plus, with a docstring:\n")
GENERATED = 96
EVERY = 3  # re-score every 3rd generated position (a prefill each): 31 samples a text, seconds on a CPU
# the largest swing over a few texts understates the largest over a suite's: on an AMD EPYC (2026-11-26) one text
# gave 0.71 where a suite-wide measurement had found 1.1 (docs/architecture.md, "Numerics"), and on an H200 15
# positions of one text gave 1.00 where 189 of three gave 4.18; the margin allows half again
HEADROOM = 1.5
_FORMAT = 2


@dataclass(frozen=True, slots=True)
class Noise:
    """The largest change of a top-5 pair's logit difference, per rows a pass: against the check's prefill
    (``against_prefill``, sampled at ``positions`` positions), and against a pass of 1 row (``against_one_row``, at
    every position of the texts)."""

    against_prefill: dict[int, float]
    against_one_row: dict[int, float]
    positions: int

    @property
    def margin(self) -> float:
        """A gap on the check's prefill within this can be two decode paths ranking a near-tie differently."""
        return HEADROOM * max(self.against_prefill.values())

    @property
    def decode_margin(self) -> float:
        """A gap on target-only's own path (1 row a pass) within this can be a verifying pass ranking it otherwise."""
        return HEADROOM * max(self.against_one_row.values(), default=0.0)

    def margins(self) -> dict[str, float]:
        """The margin for a gap measured on each path (bench/compare.py's ``path``)."""
        return {"prefill": self.margin, "decode": self.decode_margin}

    def describe(self) -> str:
        def rows(by: dict[int, float]) -> str:
            return ", ".join(f"{n} row{'s' if n > 1 else ''} {v:.2f}" for n, v in sorted(by.items()))

        return (f"near-tie margin {self.margin:.2f} on the check's prefill, {self.decode_margin:.2f} on target-only's "
                f"path ({HEADROOM} x the largest top-5 pair swing: against the prefill {rows(self.against_prefill)}; "
                f"against 1 row {rows(self.against_one_row)}; {self.positions} prefills)")

    def to_json(self) -> str:
        return json.dumps({"format": _FORMAT, "against_prefill": self.against_prefill,
                           "against_one_row": self.against_one_row, "positions": self.positions})


def measure_noise(ctx: Context, prompts: Sequence[Sequence[int]], generated: int = GENERATED, every: int = EVERY,
                  cancelled: Callable[[], bool] | None = None) -> Noise:
    """Each prompt's greedy text decoded 1 row a pass (as target-only runs), then the same text in passes of 4, 8
    and 16 rows (as verifying passes run), against a prefill of prompt + prefix at every ``every``-th position (as
    the check scores). The cache is left empty."""
    prefill: dict[int, float] = {}
    one_row: dict[int, float] = {}
    positions = 0
    ctx.clear()
    try:
        for prompt in prompts:
            rows = _decoded(ctx, list(prompt), generated, cancelled)
            for j in range(len(rows[1]) - 1):  # every decode path against 1 row, at every position
                pairs = _top_pairs(rows[1][j])
                for n, by in rows.items():
                    if n > 1:
                        one_row[n] = max(one_row.get(n, 0.0), _swing(by[j], rows[1][j], pairs))
            text = [int(r.argmax()) for r in rows[1]]
            for j in range(every, len(text) - 1, every):  # the check's path: one prefill, its last row read
                ctx.clear()
                scored = ctx.decode([*prompt, *text[:j]])[-1]
                pairs = _top_pairs(scored)
                for n, by in rows.items():
                    prefill[n] = max(prefill.get(n, 0.0), _swing(by[j], scored, pairs))
                positions += 1
                _check(cancelled)
    finally:
        ctx.clear()
    return Noise(prefill, one_row, positions)


def _decoded(ctx: Context, prompt: list[int], generated: int,
             cancelled: Callable[[], bool] | None) -> dict[int, list[np.ndarray]]:
    """rows[n][j]: the prediction after prompt + the first j tokens of the greedy text, from passes of n rows."""
    ctx.clear()
    first = ctx.decode(prompt)[-1].copy()
    rows = {1: [first]}
    text = [int(first.argmax())]
    while len(text) < generated:
        rows[1].append(ctx.decode(text[-1:])[-1].copy())
        text.append(int(rows[1][-1].argmax()))
        _check(cancelled)
    for n in ROWS[1:]:
        if n > ctx.max_rows:
            continue
        ctx.clear()
        ctx.decode(prompt)
        rows[n] = [first]
        for i in range(0, len(text) - 1, n):
            rows[n] += [r.copy() for r in ctx.decode(text[i:i + n], all_logits=True)]
            _check(cancelled)
    return rows


def _top_pairs(row: np.ndarray) -> np.ndarray:
    # the top 5 as a set: a pair's order only flips the sign of a difference whose size is taken (a whole sort of
    # the 262k-token row was a tenth of the measurement)
    return np.array(list(combinations(np.argpartition(row, -TOP)[-TOP:], 2)))


def _swing(row: np.ndarray, reference: np.ndarray, pairs: np.ndarray) -> float:
    """The largest change of a pair's logit difference from ``reference`` to ``row``."""
    a, b = pairs[:, 0], pairs[:, 1]
    return float(np.abs((row[a] - row[b]) - (reference[a] - reference[b])).max())


def load_or_measure_noise(ctx: Context, model_hash: str, device: Device, prompts: Sequence[Sequence[int]], *,
                          again: bool = False, say: Callable[[str], None] | None = None,
                          cancelled: Callable[[], bool] | None = None, generated: int = GENERATED,
                          every: int = EVERY) -> Noise:
    """This device's noise, cached per model and device like its pass costs, or measured now (a few seconds on a
    CPU, well under one on a GPU)."""
    return cached(cache_path(model_hash, device, max(ROWS), "noise"), _read,
                  lambda: measure_noise(ctx, prompts, generated, every, cancelled=cancelled),
                  "measuring how far this device's logits move with a pass's size (the near-tie margins), once",
                  again=again, say=say)


def _read(path: os.PathLike[str]) -> Noise | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("format") != _FORMAT:
            return None  # another layout: measured anew
        return Noise({int(n): float(v) for n, v in data["against_prefill"].items()},
                     {int(n): float(v) for n, v in data["against_one_row"].items()}, int(data["positions"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _check(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise KeyboardInterrupt
