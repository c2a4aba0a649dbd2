#!/usr/bin/env python3
"""The built-in suite replayed on a GPU cost table, as localspec ran before pass shapes and as it runs now, against
what the H100 lived (../shared/gpu/h100-2026-11-25/); and the fit of the table's host time and graph capture to
those live runs (docs/performance-notes.md at 1a3f1f9, "Pass shapes on a GPU").

Takes each suite prompt's greedy target-only output from tools/replay-outputs.json (the same texts on any machine;
replay_tables.outputs: REPLAY_OUTPUTS=here generates this machine's own, cached in bench-out/; REPLAY_OUTPUTS=FILE
prices another machine's, such as a GPU's saved by tools/gpu_live.sh 9), then prices n-gram
drafting on the table: one at a time with fixed k = 3, 7, 15 and the adaptive policy, and as one batch of 8 and 16
lanes; "before" replays the policy without pass shapes (every
pass its own size, as at be0108d), "now" with the sizes the table's device keeps.

    .venv/bin/python tools/gpu_replay.py [--table h100]     # the comparison, medians per category
    .venv/bin/python tools/gpu_replay.py --fit              # fit host time and capture to the live figures
    .venv/bin/python tools/gpu_replay.py --check            # the shipped table against the live figures
    .venv/bin/python tools/gpu_replay.py --suite ../shared/bench/prompts.jsonl   # prompts the fit never saw
    .venv/bin/python tools/gpu_replay.py --ceiling          # each goal against what the passes allow
    .venv/bin/python tools/gpu_replay.py --ceiling --prompt-share 0.4   # ... a batch's prompts priced
    .venv/bin/python tools/gpu_replay.py --host             # the Python work per pass, timed on this machine
    .venv/bin/python tools/gpu_replay.py --host --code bench-out/at/d5deebfcce1a   # ... as at another commit
    .venv/bin/python tools/gpu_replay.py --host --k 3                              # ... drafts pinned at k = 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--code" in sys.argv[:-1]:  # localspec from another tree (before the imports below): before/after timings
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve()))

from replay_tables import outputs  # noqa: E402

from localspec.bench.replay import CostTable, Known, load_cost_table, replay, replay_batch, replay_oracle  # noqa: E402
from localspec.bench.suite import load_suite  # noqa: E402

# what the H100 lived on 2026-11-25 at be0108d (bench-k.txt, graphs/bench-graphs-on.txt, parallel-*.txt, batch-k/):
# medians over the built-in suite of each prompt's speedup over target-only; the suite as one batch over one at a time
LIVE = {"k=3": 1.47, "k=7": 1.85, "k=15": 1.54, "plain batch, 8 lanes": 2.87, "plain batch, 16 lanes": 3.19,
        "k=3 batch, 8 lanes": 3.25, "k=3 batch, 16 lanes": 3.91}
LIVE_TARGET_ONLY_MS = 1.25  # a target-only token: 754 and 849 tok/s in two runs
# what the fit never sees, the figures a replay is for: the adaptive policy as it lived (two runs each), one at a time
# (bench-k.txt, graphs/bench-graphs-on.txt) and as one batch (batch-k/par-*-adaptive.txt, parallel-*.txt)
LIVE_ADAPTIVE = {"adaptive": (1.37, 1.53), "adaptive batch, 8 lanes": (2.69, 2.71),
                 "adaptive batch, 16 lanes": (2.95, 3.18)}
# medians of each prompt's tokens a target pass there (bench-k.txt; 3.70 for adaptive in the graphs run): the H100's
# greedy texts parted from these at near-ties (34 of 48 runs) and draft much further than the shipped ones
LIVE_TOKENS_A_PASS = {"k=3": 2.70, "k=7": 4.00, "k=15": 4.62, "adaptive": 3.73}


def per_prompt(table: CostTable, outs: dict, ids: list[str], k: int | None, *, shapes: bool,
               drafter: str = "ngram") -> dict[str, float]:
    """Each prompt's speedup over target-only (both priced on ``table``)."""
    return {i: speedup for i, (speedup, _) in per_prompt_stats(table, outs, ids, k, shapes=shapes,
                                                                drafter=drafter).items()}


def per_prompt_stats(table: CostTable, outs: dict, ids: list[str], k: int | None, *, shapes: bool,
                     drafter: str = "ngram") -> dict[str, tuple[float, float]]:
    """Each prompt's (speedup over target-only, tokens a target pass), both priced on ``table``."""
    out = {}
    for i in ids:
        prompt, output, eog = outs[i]
        plain = replay("none", prompt, output, table, eog=eog).decode_seconds
        if drafter == "oracle":
            out[i] = (plain / replay_oracle(prompt, output, table, eog=eog).decode_seconds, 0.0)
        else:
            stats = replay(drafter, prompt, output, table, k=k, eog=eog, shapes=shapes)
            out[i] = (plain / stats.decode_seconds, stats.mean_accepted_length)
    return out


def batch_rate(table: CostTable, known: list[Known], drafter: str, lanes: int, k: int | None, *,
               shapes: bool, runs: Callable[[Known], list[int]] | None = None) -> float:
    return replay_batch(drafter, known, table, lanes, k=k, shapes=shapes, runs=runs).tokens_per_second


def figures(table: CostTable, outs: dict, ids: list[str], *, adaptive: bool = False,
            ) -> tuple[dict[str, float], dict[str, float]]:
    """The live figures' counterparts in the replay, before pass shapes (``adaptive``: LIVE_ADAPTIVE's too), and
    the median tokens a target pass of each one-at-a-time figure (LIVE_TOKENS_A_PASS's): each replayed once."""
    got, tokens = {}, {}
    for k in (3, 7, 15, *([None] if adaptive else [])):
        name = "adaptive" if k is None else f"k={k}"
        stats = per_prompt_stats(table, outs, ids, k, shapes=False).values()
        got[name] = statistics.median(speedup for speedup, _ in stats)
        tokens[name] = statistics.median(a_pass for _, a_pass in stats)
    known = [Known(*outs[i]) for i in ids]
    single = batch_rate(table, known, "none", 1, None, shapes=False)
    for lanes in (8, 16):
        got[f"plain batch, {lanes} lanes"] = batch_rate(table, known, "none", lanes, None, shapes=False) / single
        got[f"k=3 batch, {lanes} lanes"] = batch_rate(table, known, "ngram", lanes, 3, shapes=False) / single
        if adaptive:
            got[f"adaptive batch, {lanes} lanes"] = batch_rate(table, known, "ngram", lanes, None,
                                                               shapes=False) / single
    return got, tokens


def check(table: CostTable, outs: dict, ids: list[str]) -> None:
    """Each live figure beside its replay on ``table`` and the gap, against the tolerance the table is held to; then
    what the fit never saw (the adaptive policy as it lived), and tokens a pass, which say how far the texts differ."""
    got, tokens = figures(table, outs, ids, adaptive=True)
    print(f"{table.source}, the loop as the H100 ran it (be0108d, no pass shapes; the policy believing the costs its "
          f"calibration measured there{'' if table.interleaved else ': not in this table'}), against what it "
          f"lived:\n")
    print("| figure | replayed | live | gap | within |")
    print("|---|---|---|---|---|")
    for name, live in LIVE.items():
        tolerance = 0.10 if name.startswith("plain") else 0.07
        gap = got[name] / live - 1
        print(f"| {name} | {got[name]:.2f}x | {live:.2f}x | {gap:+.1%} | {'yes' if abs(gap) <= tolerance else 'NO'} "
              f"({tolerance:.0%}) |")
    print("\nnot fitted: the adaptive policy, one at a time and as one batch\n")
    print("| figure | replayed | live (two runs) | gap |")
    print("|---|---|---|---|")
    for name, (lo, hi) in LIVE_ADAPTIVE.items():
        print(f"| {name} | {got[name]:.2f}x | {lo:.2f}–{hi:.2f}x | {got[name] / hi - 1:+.1%} to "
              f"{got[name] / lo - 1:+.1%} |")
    texts = {"": "the shipped outputs", "here": "this machine's outputs"}.get(os.environ.get("REPLAY_OUTPUTS", ""))
    print(f"\nthe texts: median tokens a target pass, replayed over {texts or os.environ['REPLAY_OUTPUTS']} against "
          "the H100's own\n")
    print("| drafts | replayed | live |")
    print("|---|---|---|")
    for name, live in LIVE_TOKENS_A_PASS.items():
        print(f"| {name} | {tokens[name]:.2f} | {live:.2f} |")


def fit(table: CostTable, outs: dict, ids: list[str]) -> CostTable:
    """Host time (base, draft step, per token, per sequence) and graph capture for the least worst relative error on
    LIVE, with target-only at its live cost per token."""
    best: tuple[float, CostTable] | None = None
    single = table.bare(1)
    ms = 1e-3
    for draft, per_token, per_sequence, capture in itertools.product(
            [0.0, 0.2 * ms], [0.0, 0.04 * ms], [0.04 * ms, 0.06 * ms, 0.08 * ms, 0.1 * ms, 0.12 * ms],
            [0.0, 0.25 * ms, 0.5 * ms]):
        base = LIVE_TARGET_ONLY_MS * ms - single - per_token - per_sequence
        t = replace(table, overhead_base=base, overhead_draft=draft, overhead_per_token=per_token,
                    overhead_per_sequence=per_sequence, capture=capture)
        got = figures(t, outs, ids)[0]
        worst = max(abs(got[name] / want - 1) for name, want in LIVE.items())
        print(f"draft {draft / ms:.2f} ms, per token {per_token / ms:.2f} ms, per sequence {per_sequence / ms:.2f} "
              f"ms, capture {capture / ms:.2f} ms: worst {100 * worst:.1f}%  "
              + "  ".join(f"{n} {v:.2f}" for n, v in got.items()), flush=True)
        if best is None or worst < best[0]:
            best = (worst, t)
    assert best is not None
    return best[1]


def ngram_runs(prompt: list[int], output: list[int], k_max: int = 16) -> list[int]:
    """How far the n-gram drafter's proposal at each output position runs right (the drafter stepped one token at a
    time): what a policy that knew each proposal's worth could verify of it."""
    from localspec.drafters.ngram import NgramDrafter

    drafter, seq, start, runs = NgramDrafter(), [*prompt, *output], len(prompt), []
    drafter.begin(prompt)
    for pos in range(len(output)):
        here = start + pos
        proposal = drafter.propose(seq[:here], k_max).tokens
        n = next((i for i, (a, b) in enumerate(zip(proposal, seq[here:], strict=False)) if a != b),
                 min(len(proposal), len(seq) - here))
        runs.append(min(n, len(output) - pos - 1))
        drafter.accept(seq[: here + 1], 0)
    return runs


def ceiling(table: CostTable, outs: dict, prompts: list) -> None:
    """Each goal against what the measured passes allow. On grounded prompts, one at a time: adaptive now, the best
    fixed k per prompt in hindsight, the n-gram's own proposals verified as far as each runs right (a policy that
    knew), a lookup keyed on the last token that picks the right occurrence, and any lookup (the oracle); all priced
    with pass shapes (a change of size costs what the table says). As one batch: plain, n-gram, drafts that are
    always right (the oracle's, adaptive and k = 15)."""
    from localspec.bench.replay import fastest_schedule

    ids = [p.id for p in prompts if p.category == "grounded"]
    by_k = [per_prompt(table, outs, ids, k, shapes=True) for k in range(1, 16)]
    rows = {"adaptive n-gram": per_prompt(table, outs, ids, None, shapes=True),
            "the best fixed k per prompt, in hindsight": {i: max(row[i] for row in by_k) for i in ids}}
    plain = {i: replay("none", *outs[i][:2], table, eog=outs[i][2]).decode_seconds for i in ids}
    knew = {i: plain[i] / fastest_schedule(ngram_runs(*outs[i][:2]), table, 17, eog=outs[i][2])[0] for i in ids}
    rows["the n-gram's proposals, each verified as far as it runs right"] = knew
    for label, suffix in [("a lookup keyed on the last token, the right occurrence", 1), ("any lookup (oracle)", 0)]:
        rows[label] = {i: plain[i] / replay_oracle(*outs[i][:2], table, eog=outs[i][2], min_suffix=suffix)
                       .decode_seconds for i in ids}
    print(f"grounded, {len(ids)} prompts, one at a time, medians over target-only on {table.source}:\n")
    for label, by in rows.items():
        print(f"| {label} | {statistics.median(by.values()):.2f}x |")
    print("\neach grounded prompt: adaptive against the n-gram's proposals, each verified as far as it runs right\n")
    print("| prompt | adaptive | that ceiling | share |")
    print("|---|---|---|---|")
    for i in ids:
        got, best = rows["adaptive n-gram"][i], knew[i]
        print(f"| {i} | {got:.2f}x | {best:.2f}x | {got / best:.2f} |")
    known = [Known(*outs[p.id]) for p in prompts]
    single = batch_rate(table, known, "none", 1, None, shapes=False)
    print(f"\nthe suite as one batch, tok/s ÷ one at a time target-only (prompt tokens priced at "
          f"{table.prompt_share:g} of a row):\n")
    print("| lanes | plain | n-gram | n-gram, k = 3 | the n-gram's proposals as far as each runs right, adaptive "
          "| ..., k = 15 | always-right drafts, adaptive | always-right drafts, k = 15 |")
    print("|---|---|---|---|---|---|---|---|")
    def own_runs(g: Known) -> list[int]:
        return ngram_runs(g.prompt, g.output)

    for lanes in (8, 16):
        cells = [batch_rate(table, known, d, lanes, k, shapes=True, runs=r)
                 for d, k, r in [("none", None, None), ("ngram", None, None), ("ngram", 3, None),
                                 ("oracle", None, own_runs), ("oracle", 15, own_runs), ("oracle", None, None),
                                 ("oracle", 15, None)]]
        print(f"| {lanes} | " + " | ".join(f"{c / single:.2f}x" for c in cells) + " |")


def host(table: CostTable, outs: dict, prompts: list, k: int | None = None) -> None:
    """The Python work of a pass, timed here: a replay runs the scheduler, the policies, the drafters and the
    verification as a live run does, only the decode is priced instead of run; fastest of 7. ``k``: pinned."""
    import localspec

    print(f"localspec from {Path(localspec.__file__).parent}")
    known = [Known(*outs[p.id]) for p in prompts]
    for lanes in (1, 8, 16):
        best, got = float("inf"), None
        for _ in range(7):
            t0 = time.perf_counter()
            got = replay_batch("ngram", known, table, lanes, k=k)
            best = min(best, time.perf_counter() - t0)
        assert got is not None
        drafts = "" if k is None else f" k={k}"
        print(f"n-gram{drafts}, {lanes} lane(s): {got.passes} passes, {got.rows / got.passes:.1f} rows a pass, "
              f"{1e3 * best / got.passes:.3f} ms of Python a pass, "
              f"{1e6 * best / got.generated_tokens:.1f} µs a token")


def compare(table: CostTable, outs: dict, prompts: list) -> None:
    ids = [p.id for p in prompts]
    cats = sorted({p.category for p in prompts})
    rows = {}
    for label, k, shapes in [("before, k=3", 3, False), ("before, k=7", 7, False), ("before, k=15", 15, False),
                             ("before, adaptive", None, False), ("now, k=3", 3, True), ("now, k=7", 7, True),
                             ("now, k=15", 15, True), ("now, adaptive", None, True)]:
        rows[label] = per_prompt(table, outs, ids, k, shapes=shapes)
    rows["oracle (k ≤ 16)"] = per_prompt(table, outs, ids, None, shapes=False, drafter="oracle")
    print(f"one at a time, n-gram, speedup over target-only on {table.device} ({table.source}), medians:\n")
    print("| policy | " + " | ".join([*cats, "(all)"]) + " |")
    print("|---|" + "---|" * (len(cats) + 1))
    for label, by in rows.items():
        meds = [statistics.median(by[p.id] for p in prompts if p.category == c) for c in cats]
        print(f"| {label} | " + " | ".join(f"{m:.2f}x" for m in [*meds, statistics.median(by.values())]) + " |")
    known = [Known(*outs[i]) for i in ids]
    single = batch_rate(table, known, "none", 1, None, shapes=False)
    print("\nthe suite as one batch, tok/s ÷ one at a time target-only:\n")
    print("| lanes | plain | n-gram before | k=3 before | n-gram now | k=3 now |")
    print("|---|---|---|---|---|---|")
    for lanes in (8, 16):
        cells = [batch_rate(table, known, "none", lanes, None, shapes=True),
                 batch_rate(table, known, "ngram", lanes, None, shapes=False),
                 batch_rate(table, known, "ngram", lanes, 3, shapes=False),
                 batch_rate(table, known, "ngram", lanes, None, shapes=True),
                 batch_rate(table, known, "ngram", lanes, 3, shapes=True)]
        print(f"| {lanes} | " + " | ".join(f"{c / single:.2f}x" for c in cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default="h100")
    ap.add_argument("--suite", type=Path, action="append",
                    help="JSONL suite instead of the built-in one (repeatable; the shared prompts are held out)")
    ap.add_argument("--fit", action="store_true", help="fit host time and capture to the live H100 figures")
    ap.add_argument("--check", action="store_true",
                    help="the table as shipped against the live H100 figures (the loop as it ran there, be0108d): "
                         "fixed k should be within 7%%, plain batching within 10%%")
    ap.add_argument("--ceiling", action="store_true", help="grounded prompts and batches: what the passes allow")
    ap.add_argument("--prompt-share", type=float, help="price a batch's prompt tokens at this share of a row (the "
                    "H100's pp32: 0.4; the shipped tables: 0, unpriced)")
    ap.add_argument("--host", action="store_true", help="time the Python work per pass (this machine, no decode)")
    ap.add_argument("--k", type=int, help="with --host: drafts pinned at this length (default: adaptive)")
    ap.add_argument("--code", type=Path, help="import localspec from this tree instead (a worktree of another "
                    "commit, as tools/at_commit makes: bench-out/at/COMMIT), for before/after --host timings")
    args = ap.parse_args()
    prompts = [p for s in (args.suite or [None]) for p in load_suite(s).prompts]
    outs = outputs(prompts)
    table = load_cost_table(args.table)
    if args.prompt_share is not None:
        table = replace(table, prompt_share=args.prompt_share)
    if args.fit:
        table = fit(table, outs, [p.id for p in prompts])
        print(f"\nfitted: base {table.overhead_base:.6f} s, draft_step {table.overhead_draft:.6f} s, per_token "
              f"{table.overhead_per_token:.6f} s, per_sequence {table.overhead_per_sequence:.6f} s, "
              f"graph_capture_seconds {table.capture:.6f}\n")
        print("  ".join(f"{n} {v:.2f} (live {LIVE[n]:.2f})"
                        for n, v in figures(table, outs, [p.id for p in prompts])[0].items()))
        return
    if args.check:
        check(table, outs, [p.id for p in prompts])
        return
    if args.ceiling:
        ceiling(table, outs, prompts)
        return
    if args.host:
        host(table, outs, prompts, args.k)
        return
    compare(table, outs, prompts)


if __name__ == "__main__":
    main()
