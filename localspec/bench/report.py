"""The benchmark report: medians per prompt and per category × drafter (bench/formats.py writes it as a table,
JSON and Markdown; bench/output.py puts those and a chart in --out).

Everything here works on finished :class:`RunRecord` objects (annotated by ``compare.annotate``), so a report can
be built from any list of runs: a complete benchmark, the part of one that finished before Ctrl-C, or a test's.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from localspec.bench.compare import BASELINE, Divergence
from localspec.bench.records import NEAR_TIE_MARGIN, RunRecord
from localspec.machine import processor_name

ALL = "(all)"  # the row of every prompt together; parenthesised so that it cannot clash with a suite's category


NOISE = 0.15  # repeats of one (prompt, drafter) whose speedups differ by more than this are not one measurement


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    threads: int
    gpu_layers: int
    llama_cpp_version: str
    device: str = ""  # where the passes ran, as the runtime says (CPU, or the GPU and its layers)


def machine_info(threads: int, gpu_layers: int, llama_cpp_version: str, device: str = "") -> Machine:
    return Machine(_cpu_name(), threads, gpu_layers, llama_cpp_version, device)


def _cpu_name() -> str:
    return f"{processor_name()} ({os.cpu_count()} cores)"


@dataclass(slots=True)
class PromptResult:
    """One (prompt, drafter): medians over its repeats, and how its outputs compared with the baseline."""

    prompt_id: str
    category: str
    drafter: str
    runs: int
    tokens_per_second: float
    speedup: float | None  # median over repeats of tok/s ÷ the same repeat's target-only tok/s
    acceptance_rate: float | None
    mean_accepted_length: float | None
    identical_to_baseline: bool | None  # every compared repeat identical; None when there was no baseline
    identical_runs: int
    compared_runs: int
    divergences: list[tuple[int, Divergence]] = field(default_factory=list)  # (repeat, where)
    spread: float | None = None  # largest ÷ smallest per-repeat speedup, minus 1 (None: fewer than 2 repeats)
    # token trees (None where nothing was drafted, or the runs predate trees): the median over repeats of the tree
    # passes and of their share of target passes, and the branches per tree pass over all repeats (None: no tree)
    tree_passes: float | None = None
    tree_share: float | None = None
    branches_per_tree_pass: float | None = None
    # under a JSON schema, over all repeats: forced tokens drafted and accepted, answers valid of those checked
    forced_drafted: int = 0
    forced_accepted: int = 0
    valid_runs: int = 0
    checked_runs: int = 0


@dataclass(slots=True)
class GroupResult:
    """One category × drafter row: medians over its prompts."""

    category: str
    drafter: str
    prompts: int
    tokens_per_second: float | None
    speedup: float | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    identical_runs: int
    compared_runs: int
    near_ties: int
    beyond_margin: int  # divergences whose logit gap exceeds the noise margin: what a loop bug would look like
    unclassified: int  # no gap measured (anchors are compared by text; interrupted classification)
    tree_share: float | None = None  # median over prompts of the share of target passes that verified a token tree
    branches_per_tree_pass: float | None = None  # median over the prompts that verified trees
    forced_drafted: int = 0  # under JSON schemas, summed over the prompts: forced tokens drafted, accepted
    forced_accepted: int = 0
    valid_runs: int = 0  # answers that parse and validate under their schema, of those checked
    checked_runs: int = 0


@dataclass(slots=True)
class Report:
    model: str
    machine: Machine
    suite: str
    command: str
    drafters: list[str]
    repeat: int
    results: list[PromptResult]
    categories: list[str]
    interrupted: bool = False
    planned_runs: int = 0
    finished_runs: int = 0
    replayed_on: str = ""  # a cost table's device: speedups were priced on it, not timed here
    margin: float = NEAR_TIE_MARGIN  # the near-tie margin the divergences were classified with (this device's)

    def groups(self) -> list[GroupResult]:
        rows = [_group(c, d, [r for r in self.results if r.category == c and r.drafter == d])
                for c in self.categories for d in self.drafters]
        rows += [_group(ALL, d, [r for r in self.results if r.drafter == d]) for d in self.drafters]
        return [g for g in rows if g.prompts]

    def divergences(self) -> list[tuple[PromptResult, int, Divergence]]:
        return [(r, rep, d) for r in self.results for rep, d in r.divergences]

    def worst_divergence(self) -> tuple[PromptResult, int, Divergence] | None:
        """The classified divergence with the largest logit gap (prompt, repeat, where): what a report names."""
        measured = [(r, rep, d) for r, rep, d in self.divergences() if d.gap is not None]
        return max(measured, key=lambda x: x[2].gap or 0.0) if measured else None

    def unstable(self) -> list[PromptResult]:
        """Results whose repeats disagree beyond timing noise: a busy machine, or too few repeats."""
        return [r for r in self.results if r.spread is not None and r.spread > NOISE]

    def title(self) -> str:
        where = f"replayed on {self.replayed_on}" if self.replayed_on else f"medians of {self.repeat} repeat(s)"
        title = f"localspec bench · {self.model} · {where}"
        if self.interrupted:
            title += f" · PARTIAL: {self.finished_runs}/{self.planned_runs} runs"
        return title


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def build_report(
    records: Sequence[RunRecord],
    *,
    model: str,
    machine: Machine,
    suite: str,
    command: str,
    drafters: Sequence[str],
    repeat: int,
    categories: Sequence[str] | None = None,
    interrupted: bool = False,
    planned_runs: int = 0,
    replayed_on: str = "",
    margin: float = NEAR_TIE_MARGIN,
) -> Report:
    """Aggregate annotated runs (see ``compare.annotate``) into per-prompt results, in suite and drafter order."""
    baseline_tps = {(r.prompt_id, r.repeat): r.tokens_per_second for r in records if r.drafter == BASELINE}
    by_pair: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        by_pair.setdefault((r.prompt_id, r.drafter), []).append(r)
    order = {d: i for i, d in enumerate(drafters)}
    prompt_order = list(dict.fromkeys(r.prompt_id for r in records))
    results: list[PromptResult] = []
    for (prompt_id, drafter), runs in sorted(
        by_pair.items(), key=lambda kv: (prompt_order.index(kv[0][0]), order.get(kv[0][1], len(order)))
    ):
        ratios = [r.tokens_per_second / baseline_tps[(prompt_id, r.repeat)] for r in runs
                  if baseline_tps.get((prompt_id, r.repeat))]
        compared = [r for r in runs if r.compared]
        results.append(PromptResult(
            prompt_id, runs[0].category, drafter, len(runs),
            statistics.median(r.tokens_per_second for r in runs),
            _median(ratios),
            _median(r.acceptance_rate for r in runs),
            _median(r.mean_accepted_length for r in runs),
            all(r.identical for r in compared) if compared else None,
            sum(1 for r in compared if r.identical),
            len(compared),
            [(r.repeat, r.divergence) for r in compared if r.divergence is not None],
            max(ratios) / min(ratios) - 1 if len(ratios) > 1 else None,
            _median(r.tree_passes for r in runs),
            _median(r.tree_share for r in runs),
            _branches_per_tree_pass(runs),
            sum(r.forced_drafted or 0 for r in runs),
            sum(r.forced_accepted or 0 for r in runs),
            sum(1 for r in runs if r.valid),
            sum(1 for r in runs if r.valid is not None),
        ))
    cats = list(categories) if categories is not None else list(dict.fromkeys(r.category for r in records))
    return Report(model, machine, suite, command, list(drafters), repeat, results, cats, interrupted,
                  planned_runs, len(records), replayed_on, margin)


def _branches_per_tree_pass(runs: Sequence[RunRecord]) -> float | None:
    trees = sum(r.tree_passes or 0 for r in runs)
    return sum(r.branches or 0 for r in runs) / trees if trees else None


def _group(category: str, drafter: str, results: list[PromptResult]) -> GroupResult:
    divs = [d for r in results for _, d in r.divergences]
    return GroupResult(
        category, drafter, len(results),
        _median(r.tokens_per_second for r in results),
        _median(r.speedup for r in results),
        _median(r.acceptance_rate for r in results),
        _median(r.mean_accepted_length for r in results),
        sum(r.identical_runs for r in results),
        sum(r.compared_runs for r in results),
        sum(1 for d in divs if d.near_tie is True),
        sum(1 for d in divs if d.near_tie is False),
        sum(1 for d in divs if d.near_tie is None),
        _median(r.tree_share for r in results),
        _median(r.branches_per_tree_pass for r in results),
        sum(r.forced_drafted for r in results),
        sum(r.forced_accepted for r in results),
        sum(r.valid_runs for r in results),
        sum(r.checked_runs for r in results),
    )
