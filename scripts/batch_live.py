#!/usr/bin/env python3
"""Issue #16's live goal on this machine: the built-in suite as one batch (`--parallel auto`) against the same
prompts one at a time, target-only and with n-gram drafts. Wall time of the whole job, model loads excluded;
rounds alternate the four ways so that a slow minute hits them alike. (`localspec bench --parallel auto
--drafters none,ngram --repeat N` prints the same.)

    .venv/bin/python scripts/batch_live.py [--rounds 2] [--parallel N]
"""

from __future__ import annotations

import argparse
import sys

from localspec.bench.parallel import live, table
from localspec.bench.suite import load_suite
from localspec.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None)
    args = ap.parse_args()
    measured = live(Settings(), load_suite(None), ["none", "ngram"], args.parallel, args.rounds,
                    lambda line: print(line, file=sys.stderr, flush=True))
    ways, lanes = measured.ways, measured.lanes
    print(table(f"--parallel {lanes}, {args.rounds} rounds, medians", ways))
    ngram = next(w for w in ways if w.drafter == "ngram" and not w.batch).tokens_per_second
    for w in ways:
        print(f"{w.name}: {w.tokens_per_second / ngram:.2f}x one at a time with ngram")


if __name__ == "__main__":
    main()
