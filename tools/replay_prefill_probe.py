"""Does pricing the prompt chunks close the batch replay's gap to live? A probe, not a fit.

A replay prices a batch's prompt chunks at the table's ``prompt_token_share`` of what as many rows with outputs
would add to the pass (CostTable.prompt); no shipped table sets it yet, so they cost nothing, and live they take time
that shrinks every speedup, the fastest way's most. This replays the suite as one batch of 8 against one at a time
target-only, as `localspec bench --parallel 8 --drafters none,ngram` lives it, with each SHARE on TABLE (default:
this machine's calibration cache file).

    .venv/bin/python tools/replay_prefill_probe.py 0 0.1 0.15 0.2     # 0: as the replay prices today
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_tables import outputs  # noqa: E402

from localspec.bench.replay import Known, load_cost_table, replay_batch  # noqa: E402
from localspec.bench.suite import load_suite  # noqa: E402
from localspec.paths import cache_dir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shares", type=float, nargs="+")
    ap.add_argument("--table", help="a cost table (default: this machine's calibration, 2 threads, CPU)")
    ap.add_argument("--lanes", type=int, default=8, help="sequences in the batch")
    ap.add_argument("--shapes-off", action="store_true", help="replay as localspec ran before pass shapes (be0108d)")
    args = ap.parse_args()
    found = sorted((cache_dir() / "calibration").glob("*-t2-g0-n17-*.json"))
    path = args.table or next((p for p in found if not p.name.endswith("-reads.json")), None)
    if path is None:
        sys.exit("no calibration here yet: run `localspec calibrate`, or give --table")
    table = load_cost_table(path)
    prompts = list(load_suite(None).prompts)
    outs = outputs(prompts)
    known = [Known(*outs[p.id]) for p in prompts]
    lanes, shapes = args.lanes, not args.shapes_off
    print(f"{table.device} ({Path(str(path)).name}); the suite as one batch, × one at a time target-only:\n")
    print(f"| prompt tokens priced at | plain batch of {lanes} | one at a time, n-gram | batch of {lanes}, n-gram |")
    print("|---|---|---|---|")
    for share in args.shares:
        priced = replace(table, prompt_share=share)
        single = replay_batch("none", known, priced, 1, shapes=shapes).tokens_per_second
        cells = [replay_batch(d, known, priced, n, shapes=shapes).tokens_per_second / single
                 for d, n in (("none", lanes), ("ngram", 1), ("ngram", lanes))]
        print(f"| {share:g} of a row | " + " | ".join(f"{c:.2f}x" for c in cells) + " |")


if __name__ == "__main__":
    main()
