#!/usr/bin/env python3
"""Over an RPC link with a delay: does the calibration price passes as the live passes cost them, and how does
adaptive k compare with fixed k prompt by prompt? (issue #18)

One llama.cpp RPC server on loopback behind the delay relay (tests/rpc_helpers.py), the embedded target, n-gram
drafting on the built-in suite's grounded prompts. Each prompt runs adaptive and each fixed k in turn, in an order
reversed every round. Prints, per pass size, the calibrated figure against the 25th percentile and median of the
live passes; then per prompt tok/s, the mean draft length, and adaptive ÷ the best fixed k.

    .venv/bin/python scripts/rpc_live_costs.py [--delay 2] [--rounds 2] [--k 3,7,15] [--out bench-out/rpc-live.json]
    .venv/bin/python scripts/rpc_live_costs.py --report --steps edit-csv   # also: each adaptive run's draft lengths
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import localspec  # noqa: E402,F401  (llama.cpp's libraries before numpy)
from tests.rpc_helpers import DelayRelay, rpc_server  # noqa: E402


def measure(delay_ms: float, rounds: int, fixed: list[int]) -> dict:
    from localspec.events import Finished, Step
    from localspec.models.embedded import ensure_default_model
    from localspec.runtime import Runtime
    from localspec.settings import GenerationSettings, RuntimeSettings, Settings, SpeculationSettings

    suite = [json.loads(line) for line in (ROOT / "localspec/bench_suites/default.jsonl").read_text().splitlines()]
    prompts = [row for row in suite if row["category"] == "grounded"]
    variants: list[int | None] = [None, *fixed]
    runs = []
    with rpc_server(threads=2) as (endpoint, _), DelayRelay(endpoint, delay_ms / 1000) as relay:
        settings = Settings(str(ensure_default_model(progress=False)),
                            RuntimeSettings(n_ctx=2048, rpc=(str(relay.endpoint),)), SpeculationSettings("ngram"))
        with Runtime.open(settings) as rt:
            rt.set_drafter("ngram")
            calibrated = dict(rt.generator.policy.costs.calibrated)
            for rnd in range(rounds):
                for prompt in prompts:
                    tokens = rt.prompt_tokens(prompt["prompt"])
                    for k in variants if rnd % 2 == 0 else variants[::-1]:
                        rt.fresh(k=k, clear_cache=True)
                        passes, tps = [], 0.0
                        for event in rt.generate(tokens, GenerationSettings(max_tokens=96)):
                            if isinstance(event, Step):
                                passes.append((event.k + 1, event.verify_seconds))
                            elif isinstance(event, Finished):
                                tps = event.stats.tokens_per_second
                        runs.append({"prompt": prompt["id"], "k": k, "round": rnd, "tps": tps, "passes": passes})
                        print(f"{prompt['id']} k={k or 'adaptive'}: {tps:.1f} tok/s", file=sys.stderr, flush=True)
    return {"delay_ms": delay_ms, "calibrated": calibrated, "runs": runs}


def report(data: dict, steps: str | None = None) -> str:
    calibrated = {int(n): s for n, s in data["calibrated"].items()}
    live: dict[int, list[float]] = defaultdict(list)
    for run in data["runs"]:
        for n, seconds in run["passes"]:
            live[n].append(seconds)
    lines = [f"d = {data['delay_ms']:g} ms one way", "| tokens in pass | calibrated ms | live 25th pct ms | "
             "live median ms | live passes |", "|---|---|---|---|---|"]
    for n in sorted(calibrated):
        got = sorted(live.get(n, []))
        p25 = f"{got[(len(got) - 1) // 4] * 1000:.1f}" if got else "–"
        median = f"{statistics.median(got) * 1000:.1f}" if got else "–"
        lines.append(f"| {n} | {calibrated[n] * 1000:.1f} | {p25} | {median} | {len(got)} |")
    speed: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    drafted: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for run in data["runs"]:
        name = "adaptive" if run["k"] is None else f"k{run['k']}"
        speed[run["prompt"]][name].append(run["tps"])
        drafted[run["prompt"]][name].extend(n - 1 for n, _ in run["passes"])
    names = list(next(iter(speed.values())))
    lines += ["", "| prompt | " + " | ".join(f"{n} tok/s (mean k)" for n in names) + " | adaptive / best fixed |",
              "|---" * (len(names) + 2) + "|"]
    ratios = []
    for prompt, by in speed.items():
        med = {n: statistics.median(by[n]) for n in names}
        ratios.append(med["adaptive"] / max(v for n, v in med.items() if n != "adaptive"))
        cells = [f"{med[n]:.1f} ({statistics.mean(drafted[prompt][n]):.1f})" for n in names]
        lines.append(f"| {prompt} | " + " | ".join(cells) + f" | {ratios[-1]:.2f} |")
    gm = statistics.geometric_mean(ratios)
    lines.append(f"\nadaptive / best fixed k per prompt: median {statistics.median(ratios):.2f}, geometric mean "
                 f"{gm:.2f}")
    for run in data["runs"] if steps else []:
        if run["prompt"] == steps and run["k"] is None:
            lines.append(f"{steps}, round {run['round'] + 1}, adaptive: drafted " + ", ".join(
                str(n - 1) for n, _ in run["passes"]) + f" ({len(run['passes'])} passes)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=2.0, help="ms one way")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--k", default="3,7,15", help="the fixed draft lengths to compare with")
    ap.add_argument("--out", default="bench-out/rpc-live.json")
    ap.add_argument("--report", action="store_true", help="only print the report of what --out holds")
    ap.add_argument("--steps", metavar="PROMPT", help="also print the draft length of each adaptive pass on PROMPT")
    args = ap.parse_args()
    out = ROOT / args.out
    if not args.report:
        data = measure(args.delay, args.rounds, [int(k) for k in args.k.split(",")])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data))
    print(report(json.loads(out.read_text()), args.steps))


if __name__ == "__main__":
    main()
