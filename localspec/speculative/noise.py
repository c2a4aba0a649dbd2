"""How far this device's numerics move the target's logits with the shape of the pass that computes them: the margin
that tells a near-tie from a real divergence in the lossless check (bench/compare.py).

Target-only decoding computes each token in a pass of 1 row; speculation verifies it inside a pass of k + 1 rows (on a
GPU, one of the kept sizes: 4, 8, 16); the check re-scores prompt + prefix as one prefill and compares the two
candidates there. Each runs other kernels (llama.cpp's small-batch kernels cover up to 8 rows on CUDA), so a pair of
candidates can swap places between paths when their logits are close. The margin is measured, per model and device,
as the largest change of a top-5 pair's logit difference between the prefill the check scores with and a decode of
the same text in passes of 1, 8 and 16 rows: a divergence whose gap (on the check's path) is within it may be two
paths ranking a near-tie differently; beyond it, it may not. Cached beside the device's calibration.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from localspec.engine import Context
from localspec.engine.device import Device
from localspec.models.files import atomic_write_text
from localspec.models.files import say as to_stderr
from localspec.speculative.calibrate import cache_path

# the margin measured on a CPU (Gemma 3 270M Q4_K_M, 2 threads; NOTES.md "Numerics"): what a check uses where this
# device's own was not measured
DEFAULT_MARGIN = 1.1
ROWS = (1, 8, 16)  # a pass of one row (target-only), a GPU's small-batch kernels' largest, and past them
TOP = 5
# the text the noise is measured on: the target's own greedy continuation of a prompt that mixes prose and a list
PROMPT = "Write a short recipe for tomato soup, with a list of ingredients and numbered steps.\n"
GENERATED = 64
EVERY = 4  # re-score every 4th generated position (a prefill each): 15 samples, seconds on a CPU
# the largest swing over one text's samples understates the largest over a suite's: on an AMD EPYC (2026-11-26) one
# text gave 0.71 where a suite-wide measurement had found 1.1 (NOTES.md); the margin allows half again
HEADROOM = 1.5


@dataclass(frozen=True, slots=True)
class Noise:
    """Per rows a pass: the largest change of a top-5 pair's logit difference against the check's prefill, and the
    largest change of a single top-5 logit; over ``positions`` positions."""

    pair_swing: dict[int, float]
    logit_swing: dict[int, float]
    positions: int

    @property
    def margin(self) -> float:
        """The near-tie margin on this device: a gap on the check's path within it can be a flip between paths."""
        return HEADROOM * max(self.pair_swing.values())

    def describe(self) -> str:
        by = ", ".join(f"{n} row{'s' if n > 1 else ''} {self.pair_swing[n]:.2f}" for n in sorted(self.pair_swing))
        return f"near-tie margin {self.margin:.2f} ({HEADROOM} x the largest top-5 pair swing against the check's " \
               f"prefill: {by}; {self.positions} positions)"

    def to_json(self) -> str:
        return json.dumps({"pair_swing": self.pair_swing, "logit_swing": self.logit_swing,
                           "positions": self.positions})


def measure_noise(ctx: Context, prompt: Sequence[int], generated: int = GENERATED, every: int = EVERY,
                  cancelled: Callable[[], bool] | None = None) -> Noise:
    """The target's greedy text after ``prompt`` decoded 1 row a pass (as target-only runs), then the same text in
    passes of 8 and 16 rows, against a prefill of prompt + prefix at every ``every``-th position (as the check
    scores). The cache is left empty."""
    rows: dict[int, list[np.ndarray]] = {}
    ctx.clear()
    try:
        first = ctx.decode(list(prompt))[-1].copy()
        text, rows[1] = [int(first.argmax())], [first]
        while len(text) < generated:  # 1 row a pass, each row kept: target-only's own path
            row = ctx.decode(text[-1:])[-1].copy()
            rows[1].append(row)
            text.append(int(row.argmax()))
            _check(cancelled)
        for n in ROWS[1:]:
            if n > ctx.max_rows:
                continue
            ctx.clear()
            ctx.decode(list(prompt))
            rows[n] = []
            for i in range(0, len(text) - 1, n):  # rows[n][j]: the prediction after prompt + text[:j + 1]
                rows[n] += [r.copy() for r in ctx.decode(text[i:i + n], all_logits=True)]
                _check(cancelled)
        pair = dict.fromkeys(rows, 0.0)
        logit = dict.fromkeys(rows, 0.0)
        positions = range(every, len(text) - 1, every)
        for j in positions:  # the check's path: prompt + prefix scored as one prefill, the last row read
            ctx.clear()
            scored = ctx.decode([*prompt, *text[:j]])[-1]
            top = np.argsort(scored)[-TOP:]
            pairs = np.array(list(combinations(top, 2)))
            base = scored[pairs[:, 0]] - scored[pairs[:, 1]]
            for n, by in rows.items():
                row = by[j] if n == 1 else by[j - 1]  # rows[1][0] is the prompt's own prediction
                pair[n] = max(pair[n], float(np.abs(row[pairs[:, 0]] - row[pairs[:, 1]] - base).max()))
                logit[n] = max(logit[n], float(np.abs(row[top] - scored[top]).max()))
            _check(cancelled)
    finally:
        ctx.clear()
    return Noise(pair, logit, len(positions))


def load_or_measure_noise(ctx: Context, model_hash: str, device: Device, prompt: Sequence[int], *,
                          again: bool = False, say: Callable[[str], None] | None = None,
                          cancelled: Callable[[], bool] | None = None, generated: int = GENERATED,
                          every: int = EVERY) -> Noise:
    """This device's noise, cached per model and device like its pass costs, or measured now (a few seconds on a
    CPU, well under one on a GPU)."""
    path = cache_path(model_hash, device, max(ROWS), "noise")
    noise = None if again else _read(path)
    if noise is None:
        (say or to_stderr)("measuring how far this device's logits move with a pass's size (the near-tie margin), "
                           "once")
        noise = measure_noise(ctx, prompt, generated, every, cancelled=cancelled)
        with contextlib.suppress(OSError):
            atomic_write_text(path, noise.to_json())
    return noise


def _read(path: os.PathLike[str]) -> Noise | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Noise({int(n): float(v) for n, v in data["pair_swing"].items()},
                     {int(n): float(v) for n, v in data["logit_swing"].items()}, int(data["positions"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _check(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise KeyboardInterrupt
