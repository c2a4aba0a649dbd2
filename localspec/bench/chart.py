"""The benchmark chart: median speedup per category and drafter, as a PNG (needs the optional matplotlib)."""

from __future__ import annotations

from pathlib import Path

from localspec.bench.compare import BASELINE
from localspec.bench.report import ALL, Report
from localspec.errors import UserError


class PlotExtraMissing(UserError):
    """matplotlib (the optional `plot` extra) is not installed."""


def write_chart(report: Report, path: Path) -> None:
    """Grouped bars: median speedup per category (and all prompts) for each drafter; the baseline is the 1.0 line."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotExtraMissing(
            "no chart: matplotlib is not installed (pip install 'localspec[plot]', or pip install matplotlib)"
        ) from None
    groups = report.groups()
    categories = [*report.categories, ALL]
    drafters = [d for d in report.drafters if d != BASELINE]
    width = 0.8 / max(1, len(drafters))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(categories) * max(1, len(drafters)) * 0.5 + 3), 4.5))
    for i, d in enumerate(drafters):
        values = []
        for c in categories:
            g = next((g for g in groups if g.category == c and g.drafter == d), None)
            values.append(g.speedup if g is not None and g.speedup is not None else 0.0)
        xs = [j + (i - (len(drafters) - 1) / 2) * width for j in range(len(categories))]
        ax.bar(xs, values, width, label=d)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="target only")
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories)
    ax.set_ylabel("speedup vs target-only (median)")
    ax.set_title(f"{report.model}: speedup by category and drafter")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
