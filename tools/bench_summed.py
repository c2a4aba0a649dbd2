#!/usr/bin/env python3
"""Each `localspec bench --json` file's summed speedup per drafter: the suite's target-only time a token, summed over
its prompts, over the same with the drafter (as if every prompt generated as many tokens: the JSON has rates, not
counts; a per-prompt median hides a change that moves single prompts either way), and the grounded median. For
before/after runs made one after the other.

    .venv/bin/python tools/bench_summed.py OUT/head-*.json OUT/base-*.json
    .venv/bin/python tools/bench_summed.py --prompts py-rename,js-retries OUT/bench.json   # those prompts only
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def summed(results: list[dict]) -> dict[str, tuple[float, float]]:
    """drafter -> (summed speedup, grounded median speedup) over the prompts target-only ran."""
    plain = {r["prompt_id"]: r["tokens_per_second"] for r in results if r["drafter"] == "none"}
    out = {}
    for drafter in dict.fromkeys(r["drafter"] for r in results):
        mine = [r for r in results if r["drafter"] == drafter and r["prompt_id"] in plain and r["speedup"]]
        before = sum(1 / plain[r["prompt_id"]] for r in mine)
        after = sum(1 / (plain[r["prompt_id"]] * r["speedup"]) for r in mine)
        grounded = [r["speedup"] for r in mine if r["category"] == "grounded"]
        out[drafter] = (before / after, statistics.median(grounded) if grounded else float("nan"))
    return out


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    args = sys.argv[1:]
    only: set[str] | None = None
    if args[0] == "--prompts" and len(args) > 2:
        only, args = set(args[1].split(",")), args[2:]
    for name in args:
        try:
            results = json.loads(Path(name).read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{name}: not a `localspec bench --json` file ({e})", file=sys.stderr)
            continue
        if only is not None:
            results = [r for r in results if r["prompt_id"] in only]
        row = summed(results)
        print(f"{name}: " + ", ".join(f"{d} {s:.3f}x (grounded {g:.2f}x)" for d, (s, g) in row.items()))


if __name__ == "__main__":
    main()
