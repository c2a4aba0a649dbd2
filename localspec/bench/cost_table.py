"""A device's measured pass costs, as a replay prices them: steady passes, passes after a change of shape, host time.

A table maps n (tokens in one pass, an output at each) to the seconds a bare pass costs when its size repeats
(``seconds_by_batch``). On a GPU that is the cost with a CUDA graph; a table measured there also carries what a pass
costs right after a change of size (``seconds_by_batch_after_change``: no graph, measured with
``GGML_CUDA_DISABLE_GRAPHS=1`` or in interleaved passes) and what the pass that captures a new graph adds
(``graph_capture_seconds``), and the replay prices each pass by where it stands in the graph's warm-up
(speculative/shapes.py ``Warmup``). A CPU table has neither: every pass costs its steady price. What localspec's
own calibration measured there with sizes interleaved (``seconds_by_batch_interleaved``) is what its policy
believed before pass shapes: a replay of that loop decides by it and prices by the passes.

A live step also pays host time around its pass (reading back, verifying, the policy, Python): a table carries that
as ``step_overhead_seconds`` (``base`` per step, ``draft_step`` more when the pass verifies a draft, ``per_token`` ×
tokens in the pass, ``per_sequence`` × sequences in it), fitted to live runs on that device (tools/gpu_replay.py
--fit). Without it a replay prices bare passes and overestimates what speculation buys. ``prompt_token_share``
prices a batch's prompt chunks (a share of what as many rows with outputs would add to the pass); no shipped table
sets it yet, so their prompts cost nothing (docs/performance-notes.md at 1a3f1f9, "The batch replay against this CPU").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from localspec.errors import UserError
from localspec.speculative.shapes import CAPTURE, Shapes


@dataclass(frozen=True, slots=True)
class CostTable:
    """Seconds per target pass by tokens in the pass (logits at every position), on one device."""

    device: str
    seconds_by_batch: dict[int, float]
    model: str = ""  # the GGUF file the passes were measured with ("" where the table does not say)
    overhead_base: float = 0.0  # seconds a live step adds to its bare pass ...
    overhead_draft: float = 0.0  # ... plus this when the pass verifies a draft ...
    overhead_per_token: float = 0.0  # ... plus this per token in the pass ...
    overhead_per_sequence: float = 0.0  # ... plus this per sequence with rows in it (a batch settles each apart)
    source: str = ""
    # a GPU's passes without a CUDA graph (right after a change of size), and what capturing one adds
    after_change: dict[int, float] = field(default_factory=dict)
    capture: float = 0.0
    # the same steady passes with their rows spread over 8 sequences (a batch's attention reads 8 caches)
    eight_lanes: dict[int, float] = field(default_factory=dict)
    # what a prompt token (no output) adds to a pass, as a share of what a row with one would add there: unpriced, a
    # batch's prompt chunks cost nothing and its replay ran 12% above this CPU's live runs (docs/performance-notes.md at
    # 1a3f1f9, "The batch replay against this CPU")
    prompt_share: float = 0.0
    # what localspec's own calibration measured there with sizes interleaved (a GPU: each pass right after another
    # size, with a read-back): the costs its policy believed before pass shapes, whatever the passes then cost
    interleaved: dict[int, float] = field(default_factory=dict)

    def bare(self, n: int) -> float:
        """A bare steady pass of n tokens: measured, interpolated between measured sizes, or extended by the last
        slope."""
        return _interpolate(self.seconds_by_batch, n)

    def unsteady(self, n: int) -> float:
        """A bare pass of n tokens right after a change of size (a steady one where the table has no such figure):
        measured, else the steady figure at the ratio of the nearest measured sizes."""
        if not self.after_change:
            return self.bare(n)
        if n in self.after_change:
            return self.after_change[n]
        ratio = {m: s / self.bare(m) for m, s in self.after_change.items()}
        return self.bare(n) * _interpolate(ratio, n, extend=False)

    def spread(self, n: int, sequences: int) -> float:
        """A steady pass of n tokens over ``sequences`` sequences: between one sequence's and eight's by their number
        (more than 8: as 8, which the table does not go past)."""
        if sequences <= 1 or not self.eight_lanes or n < min(self.eight_lanes):
            return self.bare(n)
        share = min(1.0, (sequences - 1) / 7)
        return self.bare(n) + share * (_interpolate(self.eight_lanes, n) - self.bare(n))

    def step(self, n: int, stage: int = 2, sequences: int = 1) -> float:
        """A live step whose pass holds n tokens of ``sequences`` sequences; ``stage``: where the pass stands in the
        graph's warm-up."""
        lanes = self.spread(n, sequences) - self.bare(n)
        bare = lanes + (self.bare(n) if stage > CAPTURE
                        else self.unsteady(n) + (self.capture if stage == CAPTURE else 0.0))
        host = self.overhead_base + self.overhead_per_token * n + self.overhead_per_sequence * sequences
        return bare + host + (self.overhead_draft if n > sequences else 0.0)

    def prompt(self, rows: int, tokens: int) -> float:
        """What ``tokens`` prompt tokens add to a pass of ``rows`` rows with outputs."""
        if not tokens or not self.prompt_share:
            return 0.0
        return self.prompt_share * (self.bare(rows + tokens) - (self.bare(rows) if rows else 0.0))

    def calibration(self, n_max: int, *, steady: bool = True) -> dict[int, float]:
        """What localspec's calibration would measure on that device, 1..n_max: bare steady passes, or (``steady``
        False) as its calibration measured them before pass shapes, sizes interleaved: what the table says it
        measured there, else passes right after a change of size (on a GPU, every pass without a graph)."""
        if not steady and self.interleaved:  # past its largest size, flat: its last step (16 → 17 rows) is a cliff
            return {n: _interpolate(self.interleaved, n, extend=False) for n in range(1, n_max + 1)}
        return {n: self.bare(n) if steady else self.unsteady(n) for n in range(1, n_max + 1)}

    def shapes(self, n_max: int) -> Shapes:
        """The pass sizes localspec would keep on that device (none where a change of size costs nothing)."""
        steady = self.calibration(n_max)
        after = {n: self.unsteady(n) for n in steady}
        capture = {n: after[n] + self.capture for n in steady}
        return Shapes.learn(steady, after, capture, n_max) if self.after_change else Shapes()


def _interpolate(table: dict[int, float], n: int, *, extend: bool = True) -> float:
    """``table`` at n: measured, linear between measured sizes, beyond them by the last slope (``extend``) or flat."""
    if n in table:
        return table[n]
    sizes = sorted(table)
    below = [m for m in sizes if m < n]
    above = [m for m in sizes if m > n]
    if below and above:
        lo, hi = below[-1], above[0]
    elif not extend:
        return table[below[-1] if below else above[0]]
    elif len(sizes) == 1:
        return table[sizes[0]] * n / sizes[0]
    else:
        lo, hi = (sizes[-2], sizes[-1]) if below else (sizes[0], sizes[1])
    return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)


def shipped_tables() -> dict[str, Path]:
    """The cost tables that ship with localspec, by short name (the file name without ``-gemma3-270m.json``)."""
    folder = resources.files("localspec") / "costs"
    return {p.name.removesuffix(".json").removesuffix("-gemma3-270m"): Path(str(p))
            for p in folder.iterdir() if p.name.endswith(".json")}


def _seconds(path: Path, raw: object) -> dict[int, float]:
    try:
        return {int(n): float(s) for n, s in raw.items()}  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        raise UserError(f"{path} is not a cost table: 'seconds_by_batch' must map batch sizes to seconds") from None


def load_cost_table(spec: str | Path) -> CostTable:
    """A shipped table by name (``h100``), a cost-table file (``seconds_by_batch``; localspec's calibration cache files
    under its cache directory are such files), or a flat ``{n: seconds}`` object."""
    shipped = shipped_tables()
    path = shipped.get(str(spec), Path(spec))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"no cost table {str(spec)!r}: give a file, or one of {', '.join(sorted(shipped))}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read cost table {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a cost table: expected a JSON object")
    seconds = _seconds(path, data.get("seconds_by_batch", data))
    after = _seconds(path, data.get("seconds_by_batch_after_change") or {})
    if 1 not in seconds or any(s <= 0 for s in [*seconds.values(), *after.values()]) or len(seconds) < 2:
        raise UserError(f"{path} is not a cost table: it needs positive seconds for n = 1 and at least one more size")
    overhead = data.get("step_overhead_seconds") or {}
    return CostTable(
        device=str(data.get("device", path.stem)), seconds_by_batch=seconds, model=str(data.get("model", "")),
        overhead_base=float(overhead.get("base", 0.0)), overhead_draft=float(overhead.get("draft_step", 0.0)),
        overhead_per_token=float(overhead.get("per_token", 0.0)),
        overhead_per_sequence=float(overhead.get("per_sequence", 0.0)),
        source=path.name, after_change=after, capture=float(data.get("graph_capture_seconds", 0.0)),
        eight_lanes=_seconds(path, data.get("seconds_by_batch_8_lanes") or {}),
        prompt_share=float(data.get("prompt_token_share", 0.0)),
        interleaved=_seconds(path, data.get("seconds_by_batch_interleaved") or {}),
    )
