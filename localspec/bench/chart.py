"""The benchmark chart: median speedup per category and drafter, as a PNG (needs the optional matplotlib).

Run as a script by bench/output.py, in a process of its own: ``python -P chart.py bench.json bench.png BASELINE``.
It reads the results from bench.json and imports nothing of localspec, so that llama.cpp's libraries (with which
matplotlib has crashed on a CUDA machine) are never in its process. Exit 0: drawn; NO_MATPLOTLIB: not installed,
the reason on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NO_MATPLOTLIB = 3


def draw(doc: dict[str, Any], path: Path, baseline: str) -> None:
    """Grouped bars: median speedup per category (and all prompts) for each drafter; the baseline is the 1.0 line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    groups = doc["groups"]  # in the report's order: categories, then every prompt together, drafters within each
    categories = list(dict.fromkeys(g["category"] for g in groups))
    drafters = [d for d in dict.fromkeys(g["drafter"] for g in groups) if d != baseline]
    speedup = {(g["category"], g["drafter"]): g["median_speedup"] for g in groups}
    width = 0.8 / max(1, len(drafters))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(categories) * max(1, len(drafters)) * 0.5 + 3), 4.5))
    for i, d in enumerate(drafters):
        values = [speedup.get((c, d)) or 0.0 for c in categories]
        xs = [j + (i - (len(drafters) - 1) / 2) * width for j in range(len(categories))]
        ax.bar(xs, values, width, label=d)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="target only")
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories)
    ax.set_ylabel("speedup vs target-only (median)")
    ax.set_title(f"{doc['model']}: speedup by category and drafter")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    results, png, baseline = argv
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("no chart: matplotlib is not installed (pip install 'localspec[plot]', or pip install matplotlib)",
              file=sys.stderr)
        return NO_MATPLOTLIB
    draw(json.loads(Path(results).read_text(encoding="utf-8")), Path(png), baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
