"""`bench --out DIR`: bench.json and bench.md, written first, then the chart (bench.png), drawn in a child process.

The chart is a picture of results that are already on disk, and drawing it is what can crash: on a CUDA machine,
``import matplotlib.pyplot`` segfaulted in a process that had loaded llama.cpp's CUDA libraries, after the whole
benchmark ran. So the results are written before it, and the child (bench/chart.py, a plain script that imports
nothing of localspec, so no llama.cpp either) reads bench.json; a chart that fails is a warning, never a lost run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from localspec.bench import chart
from localspec.bench.compare import BASELINE
from localspec.bench.formats import to_document, to_markdown
from localspec.bench.report import Report
from localspec.errors import UserError

JSON_NAME, MARKDOWN_NAME, CHART_NAME = "bench.json", "bench.md", "bench.png"


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


def write_outputs(report: Report, out: Path, replayed: Report | None = None) -> tuple[list[Path], str | None]:
    """Write bench.json and bench.md into ``out``, then draw bench.png; returns the files written and a warning
    (no chart, and why) or None."""
    _make(out)
    results = out / JSON_NAME
    _write_json(to_document(report, replayed), results)
    _write_markdown(report, replayed, out, chart=None)
    warning = draw_chart(results, out / CHART_NAME)
    if warning is not None:
        return [results, out / MARKDOWN_NAME], warning
    _write_markdown(report, replayed, out, chart=CHART_NAME)  # now that there is a picture to link
    return [results, out / MARKDOWN_NAME, out / CHART_NAME], None


def write_document(document: dict[str, Any], markdown: str, out: Path) -> list[Path]:
    """bench.json and bench.md as given (``bench --parallel``'s report: a few ways, no categories to chart)."""
    _make(out)
    _write_json(document, out / JSON_NAME)
    (out / MARKDOWN_NAME).write_text(markdown, encoding="utf-8")
    return [out / JSON_NAME, out / MARKDOWN_NAME]


def _make(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create --out directory {out}: {exc.strerror}") from None


def _write_json(document: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_markdown(report: Report, replayed: Report | None, out: Path, chart: str | None) -> None:
    markdown = to_markdown(report, chart)
    if replayed is not None:
        markdown += "\n" + to_markdown(replayed).replace("# localspec performance", "# Replayed", 1)
    (out / MARKDOWN_NAME).write_text(markdown, encoding="utf-8")


def draw_chart(results: Path, png: Path) -> str | None:
    """bench.png from bench.json, in a child process; None when drawn, else a one-line reason."""
    # -P: the script's folder (localspec/bench) does not go first on sys.path, where its files could shadow
    # modules that matplotlib imports
    child = subprocess.run([sys.executable, "-P", chart.__file__, str(results), str(png), BASELINE],
                           capture_output=True, text=True)
    if child.returncode == 0:
        return None
    said = [line for line in child.stderr.splitlines() if line.strip()]
    if child.returncode == chart.NO_MATPLOTLIB and said:
        return said[-1]
    if child.returncode < 0:
        try:
            how = signal.Signals(-child.returncode).name
        except ValueError:
            how = f"signal {-child.returncode}"
        return f"no chart: drawing it crashed ({how})"
    return f"no chart: drawing it failed (exit {child.returncode}{': ' + said[-1] if said else ''})"
