#!/usr/bin/env python3
"""Issue #18's measurements on one machine: the target on one llama.cpp RPC server on loopback, behind a relay that
holds every chunk d ms each way (tests/rpc_helpers.py; this kernel has no netem), against the same model local.

For each one-way delay d: the pass-cost table over RPC (rows 1..16, saved in the format of the shipped tables,
localspec/costs/), then `localspec bench` on the built-in suite's grounded prompts with target-only, adaptive n-gram
and n-gram at fixed k = 3, 7, 15. Local first, then every delay; prints one table.

    scripts/setup --rpc
    .venv/bin/python tools/rpc_bench.py [--delays 0,0.5,2] [--repeat 1] [--max-tokens 96] [--out bench-out/rpc]
    .venv/bin/python tools/rpc_bench.py --delays 0,0.5 --out bench-out/rpc --report   # the table of a past run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import localspec  # noqa: E402,F401  (llama.cpp's libraries before numpy)
from tests.rpc_helpers import DelayRelay, rpc_server  # noqa: E402

DRAFTERS = "none,ngram,ngram:k3,ngram:k7,ngram:k15"


def bench(suite: Path, args: argparse.Namespace, rpc: str | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "localspec", "bench", "--suite", str(suite), "--drafters", DRAFTERS, "--repeat",
           str(args.repeat), "-n", str(args.max_tokens), "--json"]
    if rpc:
        cmd += ["--rpc", rpc]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out.write_text(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"bench failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def pass_costs(rpc: str, delay_ms: float, out: Path) -> dict[int, float]:
    from localspec.machine import processor_name
    from localspec.models.embedded import ensure_default_model
    from localspec.runtime import Runtime
    from localspec.settings import HistorySettings, RuntimeSettings, Settings, SpeculationSettings
    from localspec.speculative.calibrate import measure

    settings = Settings(str(ensure_default_model(progress=False)), RuntimeSettings(n_ctx=512, rpc=(rpc,)),
                        SpeculationSettings(drafter="none"), history=HistorySettings("off"))
    with Runtime.open(settings) as rt:
        seconds = measure(rt.context, 16, say=lambda _: None).seconds
        reads = rt.reads
    table = {
        "device": f"llama.cpp RPC server on loopback ({processor_name()}), {delay_ms:g} ms one way (relay)",
        "model": "gemma-3-270m-q4_k_m.gguf",
        "measured": time.strftime("%Y-%m-%d") + ": localspec's calibration (tools/rpc_bench.py)",
        "seconds_by_batch": {str(n): round(s, 6) for n, s in sorted(seconds.items())},
    }
    if reads is not None:  # how passes are read back over this link, and the two ways' costs (choose_reads)
        table["reads"] = "token ids" if reads.ids else "logits"
        table["reads_seconds"] = {how: {str(n): round(t, 6) for n, t in by_n.items()}
                                  for how, by_n in reads.seconds.items()}
    out.write_text(json.dumps(table, indent=1) + "\n")
    return seconds


def table(results: dict[str, dict], costs: dict[str, dict[int, float]]) -> str:
    """One row per setup: tok/s target-only, each drafter's median speedup over it (bench's summary), and adaptive
    against the best fixed k: by the median speedup, and by the geometric mean of the prompts' speedups."""
    names = DRAFTERS.split(",")
    lines = ["| setup | pass of 1 | pass of 8 / of 1 | " + " | ".join(
        "target-only tok/s" if n == "none" else n for n in names) + " | adaptive / best fixed: median, gm |",
        "|---" * (len(names) + 4) + "|"]
    fixed = [n for n in names if ":k" in n]
    for setup, doc in results.items():
        s = {name: doc["summary"][name]["grounded"] for name in names}
        c = costs.get(setup)
        cost = f"{c[1] * 1000:.1f} ms | {c[8] / c[1]:.2f}" if c else "– | –"
        cells = [f"{s['none']['median_tokens_per_second']:.1f}"] + [f"{s[n]['median_speedup']:.2f}x" for n in names[1:]]
        by_median = s["ngram"]["median_speedup"] / max(s[n]["median_speedup"] for n in fixed)
        gm = {n: statistics.geometric_mean([r["speedup"] for r in doc["results"] if r["drafter"] == n])
              for n in names[1:]}
        cells.append(f"{by_median:.2f}, {gm['ngram'] / max(gm[n] for n in fixed):.2f}")
        lines.append(f"| {setup} | {cost} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delays", default="0,0.5,2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default="bench-out/rpc")
    ap.add_argument("--report", action="store_true", help="only print the table of what --out holds")
    args = ap.parse_args()
    out = ROOT / args.out
    if args.report:
        print(table(*_saved(out, [float(x) for x in args.delays.split(",")])))
        return
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in (ROOT / "localspec/bench_suites/default.jsonl").read_text().splitlines()]
    suite = out / "grounded.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows if r["category"] == "grounded"))
    results = {"local": bench(suite, args, None, out / "local.json")}
    costs: dict[str, dict[int, float]] = {}
    print("local done", file=sys.stderr, flush=True)
    for d in (float(x) for x in args.delays.split(",")):
        with rpc_server(threads=2) as (endpoint, _):
            relay = DelayRelay(endpoint, d / 1000) if d > 0 else None
            with relay if relay is not None else _nothing():
                rpc = str(relay.endpoint if relay is not None else endpoint)
                costs[f"rpc d={d:g} ms"] = pass_costs(rpc, d, out / f"costs-rpc-d{d:g}.json")
                results[f"rpc d={d:g} ms"] = bench(suite, args, rpc, out / f"rpc-d{d:g}.json")
        print(f"d={d:g} ms done", file=sys.stderr, flush=True)
    (out / "all.json").write_text(json.dumps(results, indent=1))
    print(table(results, costs))
    print(f"raw results in {out}")


def _saved(out: Path, delays: list[float]) -> tuple[dict[str, dict], dict[str, dict[int, float]]]:
    results = {"local": json.loads((out / "local.json").read_text())}
    costs = {}
    for d in delays:
        results[f"rpc d={d:g} ms"] = json.loads((out / f"rpc-d{d:g}.json").read_text())
        saved = json.loads((out / f"costs-rpc-d{d:g}.json").read_text())["seconds_by_batch"]
        costs[f"rpc d={d:g} ms"] = {int(n): t for n, t in saved.items()}
    return results, costs


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
