"""A benchmark report as JSON (bench.json, --json), a rich table (the terminal) and Markdown (bench.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from localspec.bench.compare import Divergence
from localspec.bench.report import ALL, GroupResult, Report

# ---- JSON -------------------------------------------------------------------------------------------------------

def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _divergence_json(repeat: int, d: Divergence) -> dict[str, Any]:
    return {"repeat": repeat, "unit": d.unit, "position": d.position, "baseline_token": d.baseline_token,
            "token": d.token, "logit_gap": _r(d.gap), "near_tie": d.near_tie, "gap_measured_on": d.path}


def to_json(report: Report) -> dict[str, Any]:
    # the table's rows: per category (and "(all)") × drafter, medians over prompts
    groups = [
        {"category": g.category, "drafter": g.drafter, "prompts": g.prompts,
         "median_tokens_per_second": _r(g.tokens_per_second, 2), "median_speedup": _r(g.speedup),
         "median_acceptance_rate": _r(g.acceptance_rate), "median_tokens_per_pass": _r(g.mean_accepted_length),
         "median_tree_pass_share": _r(g.tree_share),
         "median_branches_per_tree_pass": _r(g.branches_per_tree_pass, 2),
         "identical_runs": g.identical_runs, "compared_runs": g.compared_runs,
         "forced_drafted": g.forced_drafted, "forced_accepted": g.forced_accepted,
         "valid_runs": g.valid_runs, "checked_runs": g.checked_runs}
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
        "near_tie_margin": _r(report.margin),
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
             "branches_per_tree_pass": _r(r.branches_per_tree_pass, 2),
             "forced_drafted": r.forced_drafted, "forced_accepted": r.forced_accepted,
             "valid_runs": r.valid_runs, "checked_runs": r.checked_runs}
            for r in report.results
        ],
        "summary": summary,
        "groups": groups,
    }


def to_document(report: Report, replayed: Report | None) -> dict[str, Any]:
    """The --json document: the live report, and the replayed one under "replay"."""
    doc = to_json(report)
    if replayed is not None:
        doc["replay"] = to_json(replayed)
    return doc


# ---- terminal and Markdown tables ----------------------------------------------------------------------------------

# the tree columns come last, after the lossless check, so that existing readers of the table keep their columns;
# under JSON schemas, the forced tokens accepted of those drafted and the valid answers after them
_HEADERS = ("category", "drafter", "tok/s", "speedup", "accepted", "tokens/pass", "identical", "tree passes",
            "branches/tree")
_SCHEMA_HEADERS = ("forced", "valid")
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


def _schema_cells(g: GroupResult) -> tuple[str, str]:
    return ("–" if not g.forced_drafted else f"{g.forced_accepted}/{g.forced_drafted}",
            "–" if not g.checked_runs else f"{g.valid_runs}/{g.checked_runs}")


def _schemas(report: Report) -> bool:
    """Whether any prompt ran under a JSON schema: the table then shows its columns."""
    return any(r.checked_runs for r in report.results)


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
    schemas = _schemas(report)
    for i, h in enumerate(_HEADERS + (_SCHEMA_HEADERS if schemas else ())):
        table.add_column(h, justify="left" if i < 2 else "right")
    previous = None
    for g in report.groups():
        if previous is not None and g.category != previous:
            table.add_section()
        previous = g.category
        cells = list(_cells(g)) + (list(_schema_cells(g)) if schemas else [])
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
    schemas = _schemas(report)
    if schemas:
        lines.append("- under a JSON schema: forced is the tokens its grammar forced, accepted of drafted; valid is "
                     "the answers that parse and validate under the schema, of all its runs")
    headers = _HEADERS + (_SCHEMA_HEADERS if schemas else ())
    lines += ["", "## By category and drafter", "", _md_row(headers), _md_row(("---",) * len(headers))]
    lines += [_md_row(_cells(g) + (_schema_cells(g) if schemas else ())) for g in report.groups()]
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
                     f"within {report.margin:.2f}, this device's measured noise between pass sizes):")
        lines.append("")
        lines += [f"- {d}" for d in divs]
    else:
        lines.append("Every greedy run produced exactly the target-only output.")
    return "\n".join(lines) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
