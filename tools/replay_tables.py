#!/usr/bin/env python3
"""Judge the draft-length policy on every shipped cost table, without the hardware (docs/performance.md).

Prices the shipped greedy target-only outputs of each suite prompt (tools/replay-outputs.json; a prompt it lacks,
or every prompt with REPLAY_OUTPUTS=here, is generated once on this machine and cached in bench-out/;
REPLAY_OUTPUTS=FILE prices another machine's, such as a GPU's saved by tools/gpu_live.sh 9), then replays
n-gram drafting with fixed k = 1..15, the adaptive policy and the oracle on each table (localspec/bench/replay.py),
and prints per table: the grounded medians, the best fixed k, adaptive ÷ best fixed k, and the lowest adaptive
speedup on an open-ended prompt.

    .venv/bin/python tools/replay_tables.py [--suite FILE ...] [--tables h100,epyc-avx2-2t,spr-2t]
    .venv/bin/python tools/replay_tables.py --validate LIVE.json   # replay vs the live runs in LIVE.json
    .venv/bin/python tools/replay_tables.py --trees               # token trees (--branches 4) against one chain
    .venv/bin/python tools/replay_tables.py --summed              # each suite as a whole, adaptive and fixed k
    .venv/bin/python tools/replay_tables.py --ship-outputs        # this machine's outputs become the shipped ones
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from localspec.bench.replay import CostTable, load_cost_table, replay, replay_oracle, shipped_tables
from localspec.bench.suite import BenchPrompt, load_suite

ROOT = Path(__file__).resolve().parents[1]
FIXED_KS = range(1, 16)


SHIPPED_OUTPUTS = ROOT / "tools" / "replay-outputs.json"


def _key(p: BenchPrompt) -> str:
    return hashlib.sha256(json.dumps([p.prompt, p.max_tokens]).encode()).hexdigest()[:16]


def outputs(prompts: list[BenchPrompt], *, here: bool = False) -> dict[str, tuple[list[int], list[int], bool]]:
    """prompt id -> (prompt tokens, greedy target-only output, ended on end-of-generation). The shipped outputs
    (tools/replay-outputs.json) where they have the prompt, so that a replayed figure does not depend on the
    machine: greedy texts differ between CPUs at near-ties, and the same code replayed the 16-lane batch at 3.95x
    over one machine's texts and 4.11x over another's. Other prompts (and all, with REPLAY_OUTPUTS=here) are
    generated once on this machine and cached (bench-out/replay-outputs.json, keyed by each prompt's text and
    budget, so suites share it). ``here``: this machine's only, as REPLAY_OUTPUTS=here; REPLAY_OUTPUTS=FILE: that
    file's (another machine's, in the cache's form) instead of the shipped ones. (No suite here has stop
    strings: an output shorter than its budget ended on end-of-generation.)"""
    cache = ROOT / "bench-out" / "replay-outputs.json"
    known = _read_outputs(cache)
    chosen = os.environ.get("REPLAY_OUTPUTS", "")
    if here or chosen == "here":
        shipped = {}
    elif chosen:
        shipped = other_texts(chosen)
        mine = [p.id for p in prompts if _key(p) not in shipped]
        if mine:
            print(f"REPLAY_OUTPUTS={chosen} has no output for {len(mine)} prompt(s) ({', '.join(mine[:4])}"
                  f"{', ...' if len(mine) > 4 else ''}): this machine's are priced for them", file=sys.stderr)
    else:
        shipped = _read_outputs(SHIPPED_OUTPUTS)
    missing = [p for p in prompts if _key(p) not in known and _key(p) not in shipped]
    if missing:
        from localspec.events import Step
        from localspec.runtime import Runtime
        from localspec.settings import GenerationSettings, HistorySettings, Settings, SpeculationSettings

        # the history off: target-only outputs, and nothing written into the user's history
        settings = Settings(speculation=SpeculationSettings(drafter="none"), history=HistorySettings("off"))
        with Runtime.open(settings) as rt:
            for p in missing:
                prompt = rt.prompt_tokens(p.prompt)
                rt.fresh(clear_cache=True)
                events = rt.generate(prompt, GenerationSettings(max_tokens=p.max_tokens))
                known[_key(p)] = (prompt, [t.id for e in events if isinstance(e, Step) for t in e.emitted])
        cache.parent.mkdir(exist_ok=True)
        cache.write_text(json.dumps({"by_prompt": known}))
    known = {**known, **shipped}
    return {p.id: (known[_key(p)][0], known[_key(p)][1], len(known[_key(p)][1]) < p.max_tokens) for p in prompts}


def _read_outputs(path: Path) -> dict:
    """A replay-outputs file's outputs by prompt key ({} where there is none)."""
    try:
        found = json.loads(path.read_text()).get("by_prompt")
    except (OSError, ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def other_texts(path: str) -> dict:
    """REPLAY_OUTPUTS=FILE: another machine's outputs in the shipped file's form (a GPU run's, saved by
    tools/gpu_live.sh 9), priced instead of the shipped ones; its missing prompts are generated here (said)."""
    found = _read_outputs(Path(path))
    if not found:
        raise SystemExit(f"REPLAY_OUTPUTS={path}: no such file, or no replay outputs in it (give 'here', or a file "
                         "that tools/replay_tables.py or gpu_live.sh 9 wrote)")
    return found


def ship_outputs(prompts: list[BenchPrompt]) -> None:
    """``prompts``' greedy outputs, generated afresh on this machine, become the shipped ones (the others there are
    kept): a cached output may be of an older build or model."""
    cache = ROOT / "bench-out" / "replay-outputs.json"
    if cache.exists():
        fresh_keys = {_key(p) for p in prompts}
        kept = _read_outputs(cache)
        cache.write_text(json.dumps({"by_prompt": {k: v for k, v in kept.items() if k not in fresh_keys}}))
    outputs(prompts, here=True)
    generated = _read_outputs(cache)
    doc = json.loads(SHIPPED_OUTPUTS.read_text()) if SHIPPED_OUTPUTS.exists() else {}
    import llama_cpp

    from localspec.machine import processor_name

    doc["about"] = (f"Greedy target-only outputs of the bench suites' prompts, generated {time.strftime('%Y-%m-%d')} "
                    f"on {processor_name()} with llama-cpp-python {llama_cpp.__version__} "
                    "by tools/replay_tables.py --ship-outputs: the texts every replay script prices unless "
                    "REPLAY_OUTPUTS=here, so a replayed figure is the same on any machine. Keyed by sha256 of "
                    "[prompt, max_tokens], first 16 hex digits: [prompt tokens, output tokens].")
    fresh = {_key(p): generated[_key(p)] for p in prompts}
    doc["by_prompt"] = dict(sorted({**doc.get("by_prompt", {}), **fresh}.items()))
    SHIPPED_OUTPUTS.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{SHIPPED_OUTPUTS}: {len(prompts)} prompts' outputs from this machine")


def speedup(table: CostTable, prompt: list[int], output: list[int], eog: bool, k: int | None) -> float:
    """n-gram drafting with fixed k (None: adaptive) over target-only, both priced on ``table``."""
    plain = replay("none", prompt, output, table, eog=eog).decode_seconds
    return plain / replay("ngram", prompt, output, table, k=k, eog=eog).decode_seconds


def speedups(table: CostTable, prompt: list[int], output: list[int], eog: bool) -> dict[str, float]:
    row = {f"k={k}": speedup(table, prompt, output, eog, k) for k in FIXED_KS}
    row["adaptive"] = speedup(table, prompt, output, eog, None)
    plain = replay("none", prompt, output, table, eog=eog).decode_seconds
    row["oracle"] = plain / replay_oracle(prompt, output, table, eog=eog).decode_seconds
    return row


def judge(tables: dict[str, CostTable], prompts: list[BenchPrompt], outs: dict) -> None:
    print("| table | best fixed k (grounded median) | adaptive (grounded median) | adaptive ÷ best k "
          "| oracle | lowest adaptive, open-ended prompt |")
    print("|---|---|---|---|---|---|")
    for name, table in tables.items():
        rows = {p.id: speedups(table, *outs[p.id]) for p in prompts}
        grounded = [p.id for p in prompts if p.category == "grounded"]
        open_ended = [p.id for p in prompts if p.category != "grounded"]
        med = {c: statistics.median(rows[i][c] for i in grounded) for c in rows[grounded[0]]}
        best = max((c for c in med if c.startswith("k=")), key=med.__getitem__)
        low = min(open_ended, key=lambda i: rows[i]["adaptive"])
        print(f"| {name} | {med[best]:.2f}x ({best}) | {med['adaptive']:.2f}x | {med['adaptive'] / med[best]:.3f} "
              f"| {med['oracle']:.2f}x | {rows[low]['adaptive']:.3f}x ({low}) |")


def summed(tables: dict[str, CostTable], suites: list[Path | None]) -> None:
    """Per table and suite: the whole suite's target-only time over its n-gram time (adaptive, k = 3, 7, 15, and the
    best fixed k of 1..15), and the grounded median. One figure for a suite, so a change that moves single prompts
    either way is weighed."""
    import localspec

    print(f"localspec from {Path(localspec.__file__).parent}")
    print("| table | suite | adaptive (grounded median) | k=3 | k=7 | k=15 | best fixed k | adaptive ÷ best fixed k |")
    print("|---|---|---|---|---|---|---|---|")
    for name, table in tables.items():
        for suite in suites:
            prompts = list(load_suite(suite).prompts)
            outs = outputs(prompts)
            plain = [replay("none", *outs[p.id][:2], table, eog=outs[p.id][2]).decode_seconds for p in prompts]
            cells = {}
            for k in (None, *FIXED_KS):
                drafted = [replay("ngram", *outs[p.id][:2], table, k=k, eog=outs[p.id][2]).decode_seconds
                           for p in prompts]
                grounded = statistics.median(a / b for p, a, b in zip(prompts, plain, drafted, strict=True)
                                             if p.category == "grounded")
                cells[k] = (sum(plain) / sum(drafted), grounded)
            best = max(FIXED_KS, key=lambda k: cells[k][0])
            label = name if "/" not in name else Path(name).name
            print(f"| {label} | {'built-in' if suite is None else Path(suite).stem} | {cells[None][0]:.3f}x "
                  f"({cells[None][1]:.2f}x) | " + " | ".join(f"{cells[k][0]:.3f}x" for k in (3, 7, 15))
                  + f" | {cells[best][0]:.3f}x (k={best}) | {cells[None][0] / cells[best][0]:.3f} |")


def hindsight(table: CostTable, prompt: list[int], output: list[int], branches: int) -> float:
    """The ceiling of any shape policy for the n-gram drafter's candidates: each step takes the (width, depth) that
    buys the most tokens per second, knowing how far each candidate matches. Speedup over target-only."""
    from localspec.drafters.ngram import NgramDrafter
    from localspec.speculative.tree import trie_sizes

    seq, pos, seconds = [*prompt, *output], len(prompt), 0.0
    drafter = NgramDrafter()
    drafter.begin(prompt)
    while pos < len(seq):
        candidates = drafter.propose(seq[:pos], min(16, len(seq) - pos - 1), branches).candidates
        rate, accepted, nodes, width = 1 / table.step(1), 0, 0, 1
        if candidates:
            runs = [next((i for i, (a, b) in enumerate(zip(c, seq[pos:], strict=False)) if a != b),
                         min(len(c), len(seq) - pos)) for c in candidates]
            depth = max(len(c) for c in candidates)
            for w, sizes in enumerate(trie_sizes(candidates, depth), start=1):
                for k in range(1, depth + 1):
                    if sizes[k] > 16:
                        break
                    got = max(min(k, r) for r in runs[:w])
                    if (1 + got) / table.step(1 + sizes[k]) > rate:
                        rate, accepted, nodes, width = (1 + got) / table.step(1 + sizes[k]), got, sizes[k], w
        seconds += table.step(1 + nodes)
        pos += accepted + 1
        drafter.accept(seq[:pos], accepted, width)
    return table.step(1) * len(output) / seconds


def unreachable(prompt: list[int], output: list[int], branches: int = 8) -> tuple[int, int]:
    """Where the oracle's source runs further than every n-gram candidate: (extra tokens it gets there, of which from
    a source not preceded by the current suffix, which no lookup can rank above the others), summed per position."""
    from localspec.drafters.ngram import NgramDrafter

    seq, extra, blind = [*prompt, *output], 0, 0
    drafter = NgramDrafter()
    drafter.begin(prompt)
    for pos in range(len(prompt), len(seq) - 1):
        candidates = drafter.propose(seq[:pos], 16, branches).candidates
        ours = max((next((i for i, (a, b) in enumerate(zip(c, seq[pos:], strict=False)) if a != b), len(c))
                    for c in candidates), default=0)
        best, source = 0, 0
        for j in range(pos):
            n = 0
            while n < 16 and j + n < pos and pos + n < len(seq) and seq[j + n] == seq[pos + n]:
                n += 1
            if n > best:
                best, source = n, j
        if best > ours:
            extra += best - ours
            blind += best - ours if source == 0 or seq[source - 1] != seq[pos - 1] else 0
        drafter.accept(seq[: pos + 1], 0)
    return extra, blind


def python_per_step(prompts: list[BenchPrompt], outs: dict, branches: int) -> float:
    """Wall seconds per step of replaying every prompt with n-gram drafting on the H100 table, best of 3."""
    table, best = load_cost_table("h100"), float("inf")
    for _ in range(3):
        start, steps = time.perf_counter(), 0
        for p in prompts:
            prompt, output, eog = outs[p.id]
            steps += replay("ngram", prompt, output, table, eog=eog, branches=branches).target_passes
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def judge_trees(tables: dict[str, CostTable], prompts: list[BenchPrompt], outs: dict, branches: int = 4) -> None:
    """Adaptive n-gram drafting with token trees of up to ``branches`` candidates against one chain, per table."""
    print(f"| table | one chain (grounded median) | trees ≤ {branches} | trees ÷ chain | lowest trees ÷ chain, any "
          "prompt | best shape in hindsight: chain / trees | oracle |")
    print("|---|---|---|---|---|---|---|")
    grounded = [p.id for p in prompts if p.category == "grounded"]
    for name, table in tables.items():
        rows = {}
        for p in prompts:
            prompt, output, eog = outs[p.id]
            plain = replay("none", prompt, output, table, eog=eog).decode_seconds
            chain = replay("ngram", prompt, output, table, eog=eog).decode_seconds
            tree = replay("ngram", prompt, output, table, eog=eog, branches=branches).decode_seconds
            rows[p.id] = {"chain": plain / chain, "tree": plain / tree, "ratio": chain / tree}
            if p.id in grounded:
                rows[p.id] |= {"h1": hindsight(table, prompt, output, 1),
                               "hw": hindsight(table, prompt, output, branches),
                               "oracle": plain / replay_oracle(prompt, output, table, eog=eog).decode_seconds}
        med = {c: statistics.median(rows[i][c] for i in grounded) for c in rows[grounded[0]]}
        low = min(rows, key=lambda i: rows[i]["ratio"])
        print(f"| {name} | {med['chain']:.2f}x | {med['tree']:.2f}x | {med['tree'] / med['chain']:.3f} "
              f"| {rows[low]['ratio']:.3f} ({low}) | {med['h1']:.2f}x / {med['hw']:.2f}x | {med['oracle']:.2f}x |")
    extra = blind = 0
    for i in grounded:
        e, b = unreachable(*outs[i][:2])
        extra, blind = extra + e, blind + b
    print(f"\nPython work per step: loop, policy and the replay's target (its clock is priced, not timed): "
          f"{python_per_step(prompts, outs, 1) * 1e6:.0f} µs with one chain, "
          f"{python_per_step(prompts, outs, branches) * 1e6:.0f} µs with trees ≤ {branches} (best of 3).")
    print(f"\nWhere the oracle runs further than all 8 n-gram candidates (grounded prompts, every position): "
          f"{blind / extra:.0%} of its extra tokens come from a source whose preceding token differs from the "
          f"current one, which no lookup can rank first.")


def validate(table: CostTable, live: dict, prompts: list[BenchPrompt], outs: dict) -> None:
    """Replayed vs lived speedup for each policy the live file measured, on the prompts both have."""
    have = {p.id for p in prompts}
    print(f"| policy | lived median | replayed median ({table.source}) | replayed ÷ lived |")
    print("|---|---|---|---|")
    for k, runs in _live_by_policy(live).items():
        runs = [r for r in runs if r["prompt_id"] in have]
        lived = statistics.median(r["speedup"] for r in runs)
        col = "adaptive" if k == "adaptive" else f"k={k}"
        replayed = statistics.median(speedups(table, *outs[r["prompt_id"]])[col] for r in runs)
        print(f"| {col} | {lived:.2f}x | {replayed:.2f}x | {replayed / lived:.2f} |")


def _live_by_policy(live: dict) -> dict[str | int, list[dict]]:
    out: dict[str | int, list[dict]] = {}
    for r in live["runs"]:
        out.setdefault(r["k"], []).append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", type=Path, action="append",
                    help="JSONL suite (repeatable). Default: the built-in suite and ../shared/bench/prompts.jsonl")
    ap.add_argument("--tables", default=",".join(sorted(shipped_tables())))
    ap.add_argument("--validate", type=Path, help="live runs to compare the replay with (h100-live format)")
    ap.add_argument("--bare", action="store_true", help="ignore the tables' step overhead (price bare passes)")
    ap.add_argument("--trees", action="store_true", help="token trees (up to 4 candidates) against one chain")
    ap.add_argument("--summed", action="store_true",
                    help="each suite's summed speedup (adaptive, k = 3, 7, 15) and grounded median, per table")
    ap.add_argument("--ship-outputs", action="store_true",
                    help=f"write this machine's greedy outputs of the suites to {SHIPPED_OUTPUTS.name} (after a "
                         "suite's prompts changed; every replayed figure moves with them)")
    args = ap.parse_args()
    suites = args.suite or [None, ROOT.parent / "shared" / "bench" / "prompts.jsonl"]
    prompts = [p for s in suites if s is None or Path(s).exists() for p in load_suite(s).prompts]
    if args.summed:
        summed({name: load_cost_table(name) for name in args.tables.split(",")},
               [s for s in suites if s is None or Path(s).exists()])
        return
    if args.ship_outputs:
        ship_outputs(prompts)
        return
    outs = outputs(prompts)
    tables = {name: load_cost_table(name) for name in args.tables.split(",")}
    if args.bare:
        bare = dict(overhead_base=0.0, overhead_draft=0.0, overhead_per_token=0.0, overhead_per_sequence=0.0)
        tables = {n: replace(t, **bare) for n, t in tables.items()}
    if args.validate:  # (the table's host time and graph capture are fitted by tools/gpu_replay.py --fit)
        validate(next(iter(tables.values())), json.loads(args.validate.read_text()), prompts, outs)
        return
    if args.trees:
        judge_trees(tables, prompts, outs)
        return
    judge(tables, prompts, outs)


if __name__ == "__main__":
    main()
