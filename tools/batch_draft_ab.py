"""A draft model in a batch against plain batching, on the same prompts and lanes, rounds interleaved.

    LOCALSPEC_HISTORY=off .venv/bin/python tools/batch_draft_ab.py --profile qwen2.5-coder-1.5b \
        --suite code-boilerplate --prompts 8 --parallel 8 --max-tokens 64 --k 3 --rounds 2

Per round: the prompts as one batch with --drafter none, with the profile's draft model at the pinned --k, and
with auto (adaptive: n-gram lookup, then the draft model where it pays); then each prompt alone at the pinned k.
Prints the tok/s of each way (medians over rounds), the draft phase's decodes a step (the deepest, against k), and
each prompt's acceptance in the batch against alone at the same k (percentage points).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen2.5-coder-1.5b")
    ap.add_argument("--suite", default="code-boilerplate", help="a shipped suite's name or a JSONL file")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import localspec  # llama.cpp's libraries before numpy (NOTES.md)
    from localspec.batch.run import run_requests
    from localspec.bench.suite import load_suite
    from localspec.cli.options import build_options
    from localspec.request import Request
    from localspec.runtime import BatchRuntime
    from localspec.settings import HistorySettings
    from localspec.speculative.jobs import PassStats

    assert localspec
    prompts = [p.prompt for p in load_suite(Path(args.suite)).prompts[: args.prompts]]
    ways = {"none": ("none", None), f"draft:k{args.k}": ("draft", args.k), "auto": ("auto", None)}
    rates: dict[str, list[float]] = {w: [] for w in ways}
    deepest: dict[str, int] = {}
    accepted: dict[str, list[tuple[int, int]]] = {}
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for way in order:
            drafter, k = ways[way]
            settings = replace(build_options(profile=args.profile, drafter=drafter, k=k, max_tokens=args.max_tokens),
                               history=HistorySettings("off"))  # no prompt drafts from its own earlier rounds
            with BatchRuntime.open(settings, args.parallel, jobs=len(prompts)) as rt:
                requests = [Request(str(i), prompt=p, max_tokens=args.max_tokens) for i, p in enumerate(prompts)]
                stats = PassStats()
                started = time.perf_counter()
                results = list(run_requests(rt, requests, stats=stats))
                seconds = time.perf_counter() - started
            tokens = sum(len(x.tokens) for x in results)
            rates[way].append(tokens / seconds)
            if drafter == "draft":
                deepest[way] = max(deepest.get(way, 0), stats.draft_deepest)
                accepted[way] = [(x.stats.accepted, x.stats.drafted) for x in sorted(results, key=lambda x: int(x.id))]
            print(f"round {r + 1}: batch, {way}: {tokens / seconds:.1f} tok/s "
                  f"({stats.draft_passes} draft decodes in {stats.draft_steps} steps)", file=sys.stderr)
    # each prompt alone at the pinned k: its acceptance, against the same prompt's in the batch
    settings = replace(build_options(profile=args.profile, drafter="draft", k=args.k, max_tokens=args.max_tokens),
                       history=HistorySettings("off"))
    with BatchRuntime.open(settings, 1, jobs=1) as rt:
        alone = []
        for i, p in enumerate(prompts):
            result = next(iter(run_requests(rt, [Request(str(i), prompt=p, max_tokens=args.max_tokens)])))
            alone.append((result.stats.accepted, result.stats.drafted))
    pinned = f"draft:k{args.k}"
    rows = []
    for i, ((a, d), (a1, d1)) in enumerate(zip(accepted[pinned], alone, strict=True)):
        rows.append({"prompt": i, "batch": round(100 * a / d, 1) if d else None,
                     "alone": round(100 * a1 / d1, 1) if d1 else None})
    report = {"profile": args.profile, "parallel": args.parallel, "k": args.k, "rounds": args.rounds,
              "tokens_per_second": {w: round(statistics.median(v), 2) for w, v in rates.items()},
              "draft_decodes_deepest_step": deepest.get(pinned), "acceptance_points": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    base = report["tokens_per_second"]["none"]
    print(f"batch of {args.parallel}, {len(prompts)} prompts x {args.max_tokens} tokens, medians of {args.rounds}:")
    for w, v in report["tokens_per_second"].items():
        print(f"  {w:10s} {v:7.1f} tok/s  {v / base:.2f}x plain batching")
    print(f"  draft decodes in the deepest step at k={args.k}: {report['draft_decodes_deepest_step']}")
    diffs = [row["batch"] - row["alone"] for row in rows if row["batch"] is not None and row["alone"] is not None]
    print("  acceptance, batch vs alone (points): " + ", ".join(f"{x:+.1f}" for x in diffs)
          + (f"; worst {max(diffs, key=abs):+.1f}" if diffs else ""))


if __name__ == "__main__":
    main()
