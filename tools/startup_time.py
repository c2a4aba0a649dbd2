#!/usr/bin/env python3
"""Time to first token of `localspec run "hi" --max-tokens 1`, from process start (docs/performance.md).

Runs each checkout given (default: this one) in fresh interpreters, one untimed run first, and prints the median.
A checkout other than this one (an older commit: `git worktree add --detach ../before COMMIT`) is imported in place
of the editable install, with this checkout's virtualenv.

    .venv/bin/python tools/startup_time.py [--runs 7] [CHECKOUT ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

# the child: import localspec from ROOT (not the editable install), run the command, report the first write
CHILD = r"""
import os, sys, time
t0 = time.perf_counter()
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, os.environ["ROOT"])
first = []
class Out:
    def write(self, s):
        if s and not first:
            first.append(time.perf_counter())
        return len(s)
    def flush(self):
        pass
sys.argv = ["localspec", "run", "hi", "--max-tokens", "1"]
sys.stdout = Out()
from localspec.cli import main
try:
    main()
except SystemExit:
    pass
print(first[0] - t0, file=sys.stderr)
"""


def first_token_seconds(root: Path) -> float:
    # the history off: the user's history (its size, a clear) must not change what start-up costs
    env = {**os.environ, "ROOT": str(root), "LOCALSPEC_HISTORY": "off"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    return float(done.stderr.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkouts", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    times: dict[Path, list[float]] = {root: [] for root in args.checkouts}
    for root in args.checkouts:
        first_token_seconds(root)  # untimed: page cache, calibration cache
    for _ in range(args.runs):  # interleaved, so that drift hits every checkout alike
        for root in args.checkouts:
            times[root].append(first_token_seconds(root))
    for root, ts in times.items():
        print(f"{root}: median {statistics.median(ts):.3f} s to the first token "
              f"(min {min(ts):.3f}, max {max(ts):.3f}, {args.runs} runs)")


if __name__ == "__main__":
    main()
