"""The benchmark report: medians per prompt and per category × drafter, as a rich table, JSON, Markdown and a PNG.

Everything here works on finished :class:`RunRecord` objects (annotated by ``compare.annotate``), so a report can
be built from any list of runs: a complete benchmark, the part of one that finished before Ctrl-C, or a test's.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from localspec.bench.compare import BASELINE, NEAR_TIE_MARGIN, Divergence
from localspec.bench.records import RunRecord
from localspec.errors import UserError
from localspec.machine import processor_name

ALL = "(all)"  # the row of every prompt together; parenthesised so that it cannot clash with a suite's category
JSON_NAME, MARKDOWN_NAME, CHART_NAME = "bench.json", "bench.md", "bench.png"


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

    def groups(self) -> list[GroupResult]:
        rows = [_group(c, d, [r for r in self.results if r.category == c and r.drafter == d])
                for c in self.categories for d in self.drafters]
        rows += [_group(ALL, d, [r for r in self.results if r.drafter == d]) for d in self.drafters]
        return [g for g in rows if g.prompts]

    def divergences(self) -> list[tuple[PromptResult, int, Divergence]]:
        return [(r, rep, d) for r in self.results for rep, d in r.divergences]

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
        ))
    cats = list(categories) if categories is not None else list(dict.fromkeys(r.category for r in records))
    return Report(model, machine, suite, command, list(drafters), repeat, results, cats, interrupted,
                  planned_runs, len(records), replayed_on)


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
    )


# ---- JSON -------------------------------------------------------------------------------------------------------

def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _divergence_json(repeat: int, d: Divergence) -> dict[str, Any]:
    return {"repeat": repeat, "unit": d.unit, "position": d.position, "baseline_token": d.baseline_token,
            "token": d.token, "logit_gap": _r(d.gap), "near_tie": d.near_tie}


def to_json(report: Report) -> dict[str, Any]:
    # the table's rows: per category (and "(all)") × drafter, medians over prompts
    groups = [
        {"category": g.category, "drafter": g.drafter, "prompts": g.prompts,
         "median_tokens_per_second": _r(g.tokens_per_second, 2), "median_speedup": _r(g.speedup),
         "median_acceptance_rate": _r(g.acceptance_rate), "median_tokens_per_pass": _r(g.mean_accepted_length),
         "median_tree_pass_share": _r(g.tree_share),
         "median_branches_per_tree_pass": _r(g.branches_per_tree_pass, 2),
         "identical_runs": g.identical_runs, "compared_runs": g.compared_runs}
        for g in report.groups()
    ]
    # the same speedups nested by drafter and category (the shape older readers of bench.json know)
    summary: dict[str, dict[str, dict[str, float | None]]] = {}
    for g in groups:
        if g["category"] != ALL:
            summary.setdefault(g["drafter"], {})[g["category"]] = {
                k: g[k] for k in ("median_speedup", "median_tokens_per_second")}
    return {
        "model": report.model,
        "machine": {"cpu": report.machine.cpu, "threads": report.machine.threads, "device": report.machine.device,
                    "gpu_layers": report.machine.gpu_layers, "llama_cpp_version": report.machine.llama_cpp_version},
        "replayed_on": report.replayed_on or None,
        "suite": report.suite,
        "command": report.command,
        "repeat": report.repeat,
        "near_tie_margin": NEAR_TIE_MARGIN,
        "complete": not report.interrupted,
        "runs": {"planned": report.planned_runs, "finished": report.finished_runs},
        "results": [
            {"prompt_id": r.prompt_id, "category": r.category, "drafter": r.drafter,
             "tokens_per_second": _r(r.tokens_per_second, 2), "speedup": _r(r.speedup),
             "acceptance_rate": _r(r.acceptance_rate), "mean_accepted_length": _r(r.mean_accepted_length),
             "identical_to_baseline": r.identical_to_baseline, "runs": r.runs,
             "identical_runs": r.identical_runs, "compared_runs": r.compared_runs, "spread": _r(r.spread),
             "divergences": [_divergence_json(rep, d) for rep, d in r.divergences],
             "tree_passes": _r(r.tree_passes, 1), "tree_pass_share": _r(r.tree_share),
             "branches_per_tree_pass": _r(r.branches_per_tree_pass, 2)}
            for r in report.results
        ],
        "summary": summary,
        "groups": groups,
    }


# ---- terminal and Markdown tables ----------------------------------------------------------------------------------

# the tree columns come last, after the lossless check, so that existing readers of the table keep their columns
_HEADERS = ("category", "drafter", "tok/s", "speedup", "accepted", "tokens/pass", "identical", "tree passes",
            "branches/tree")
IDENTICAL = _HEADERS.index("identical")


def _cells(g: GroupResult) -> tuple[str, ...]:
    return (
        g.category, g.drafter,
        "–" if g.tokens_per_second is None else f"{g.tokens_per_second:.1f}",
        "–" if g.speedup is None else f"{g.speedup:.2f}x",
        "–" if g.acceptance_rate is None else f"{g.acceptance_rate:.0%}",
        "–" if g.mean_accepted_length is None else f"{g.mean_accepted_length:.2f}",
        _identical_cell(g),
        *_tree_cells(g.tree_share, g.branches_per_tree_pass),
    )


def _tree_cells(share: float | None, per_tree: float | None) -> tuple[str, str]:
    return ("–" if share is None else f"{share:.0%}", "–" if per_tree is None else f"{per_tree:.1f}")


def _identical_cell(g: GroupResult) -> str:
    if not g.compared_runs:
        return "–"
    cell = f"{g.identical_runs}/{g.compared_runs}"
    notes = []
    if g.near_ties:
        notes.append(f"{g.near_ties} near-tie")
    if g.beyond_margin:
        notes.append(f"{g.beyond_margin} NOT near-tie")
    if g.unclassified:
        notes.append(f"{g.unclassified} differ")
    return cell + (f" ({', '.join(notes)})" if notes else "")


def render_table(report: Report) -> Table:
    table = Table(title=report.title(), title_justify="left")
    for i, h in enumerate(_HEADERS):
        table.add_column(h, justify="left" if i < 2 else "right")
    previous = None
    for g in report.groups():
        if previous is not None and g.category != previous:
            table.add_section()
        previous = g.category
        cells = list(_cells(g))
        if g.beyond_margin:
            cells[IDENTICAL] = f"[bold red]{cells[IDENTICAL]}[/]"
        elif g.near_ties or g.unclassified:
            cells[IDENTICAL] = f"[yellow]{cells[IDENTICAL]}[/]"
        table.add_row(*cells)
    return table


def divergence_lines(report: Report) -> list[str]:
    """One line per divergence from the baseline, near-ties and the rest alike."""
    return [f"{r.prompt_id} · {r.drafter} · repeat {rep + 1}: {d.describe()}" for r, rep, d in report.divergences()]


def to_markdown(report: Report, chart: str | None = None) -> str:
    m = report.machine
    lines = [
        "# localspec performance",
        "",
        f"Produced by `{report.command}` (do not edit by hand: rerun it).",
        "",
        f"- model: **{report.model}** · suite: `{report.suite}` · {report.repeat} repeat(s), medians",
        f"- machine: {m.cpu} · {m.threads} threads · {m.device or f'GPU layers {m.gpu_layers}'} · "
        f"llama-cpp-python {m.llama_cpp_version}",
        "- tok/s is timed from the first generated token; speedup is against target-only decoding (`none`) on the "
        "same prompt in the same repeat; tokens/pass is the mean accepted length (1.00 = plain decoding)",
        "- tree passes is the share of target passes that verified a token tree (several candidate continuations "
        "at once, `--branches`); branches/tree is how many branches such a pass verified",
    ]
    if report.replayed_on:
        lines.append(f"- **replayed on {report.replayed_on}**: the same outputs drafted again with the policy "
                     "calibrated on that device's cost table; tok/s and speedups are priced there, not timed")
    if report.interrupted:
        lines.append(f"- **partial**: interrupted after {report.finished_runs} of {report.planned_runs} runs")
    lines += ["", "## By category and drafter", "", _md_row(_HEADERS), _md_row(("---",) * len(_HEADERS))]
    lines += [_md_row(_cells(g)) for g in report.groups()]
    if chart:
        lines += ["", f"![speedup by category and drafter]({chart})"]
    lines += ["", "## Per prompt", "",
              _md_row(("prompt", "category", "drafter", "tok/s", "speedup", "accepted", "tokens/pass", "identical",
                       "tree passes", "branches/tree")),
              _md_row(("---",) * 10)]
    for r in report.results:
        lines.append(_md_row((
            r.prompt_id, r.category, r.drafter, f"{r.tokens_per_second:.1f}",
            "–" if r.speedup is None else f"{r.speedup:.2f}x",
            "–" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}",
            "–" if r.mean_accepted_length is None else f"{r.mean_accepted_length:.2f}",
            "–" if not r.compared_runs else f"{r.identical_runs}/{r.compared_runs}",
            *_tree_cells(r.tree_share, r.branches_per_tree_pass),
        )))
    lines += ["", "## Lossless check", ""]
    divs = divergence_lines(report)
    if divs:
        lines.append(f"Greedy runs that differ from target-only output (near-tie: the two candidates' logits are "
                     f"within {NEAR_TIE_MARGIN}, the measured batch-vs-single noise):")
        lines.append("")
        lines += [f"- {d}" for d in divs]
    else:
        lines.append("Every greedy run produced exactly the target-only output.")
    return "\n".join(lines) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def check_writable(out: Path) -> None:
    """Fail now, in one line, if ``out`` cannot take the report files."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".localspec-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UserError(f"cannot write the report to --out {out}: {reason}; choose a writable directory") from None


def to_document(report: Report, replayed: Report | None) -> dict[str, Any]:
    """The --json document: the live report, and the replayed one under "replay"."""
    doc = to_json(report)
    if replayed is not None:
        doc["replay"] = to_json(replayed)
    return doc


def write_outputs(report: Report, out: Path, replayed: Report | None = None) -> tuple[list[Path], str | None]:
    """Write bench.json, bench.md and bench.png into ``out``; returns the files and a warning (no chart) or None."""
    import json

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out directory {out}: {exc.strerror}") from None
    written: list[Path] = []
    warning = None
    chart: str | None = CHART_NAME
    from localspec.bench.chart import PlotExtraMissing, write_chart

    try:
        write_chart(report, out / CHART_NAME)
        written.append(out / CHART_NAME)
    except PlotExtraMissing as exc:
        warning, chart = str(exc), None
    doc = to_document(report, replayed)
    (out / JSON_NAME).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    markdown = to_markdown(report, chart)
    if replayed is not None:
        markdown += "\n" + to_markdown(replayed).replace("# localspec performance", "# Replayed", 1)
    (out / MARKDOWN_NAME).write_text(markdown, encoding="utf-8")
    return [out / JSON_NAME, out / MARKDOWN_NAME, *written], warning
