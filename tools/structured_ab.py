#!/usr/bin/env python3
"""Structured output, measured: a suite whose rows carry JSON schemas (default: the built-in extract-json), one
sequence at a time, in three modes on one loaded model, alternating per round so drift hits all alike:

  constrained target-only   --drafter none under each row's schema (the reference: what "lossless" is against)
  constrained               --drafter DRAFTER under the schema (forced tokens, then the drafter, cut by the grammar)
  free                      --drafter DRAFTER, no schema (what the same prompts cost unconstrained)

Reported per mode, summed over the suite: tokens, seconds, tok/s, tokens a pass, the grammar's host time a pass
(the mean, and the median and 90th percentile of the passes' own: each pass's is recorded between propose and verify),
forced tokens drafted / accepted, answers that parse and carry their schema's required keys; and whether every
constrained answer is token for token the constrained target-only one. Beside constrained speculation's speedup, its
bound: the most that its measured acceptance by draft position allows at any fixed k on this device's pass costs
(the calibration), with no host time. The history is off: no answer feeds a
later prompt's drafts.

    PYTHONPATH=. python tools/structured_ab.py [--suite extract-json] [--drafter auto] [--rounds 3] [--gpu-layers -1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import localspec  # noqa: E402,F401  (llama.cpp's libraries before numpy: the CUDA import order)
from localspec.bench.suite import load_suite  # noqa: E402
from localspec.events import Finished, Step  # noqa: E402
from localspec.runtime import Runtime  # noqa: E402
from localspec.settings import (  # noqa: E402
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    Settings,
    SpeculationSettings,
)
from localspec.structured.constraint import Constraint  # noqa: E402

MODES = ("constrained-none", "constrained", "free")
PASSES: list[float] = []  # each pass's grammar host time, in the order made (record_passes)


def record_passes() -> None:
    """Each pass's grammar host time into PASSES: what the constraint's seconds grew by since its last verify ended
    (its propose, when it drafts, and its verify)."""
    verify = Constraint.verify

    def timed_verify(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return verify(self, *args, **kwargs)
        finally:
            PASSES.append(self.seconds - getattr(self, "_ab_seconds", 0.0))
            self._ab_seconds = self.seconds

    Constraint.verify = timed_verify


def bound(by_position: list[list[int]], seconds: dict[int, float]) -> tuple[float, int]:
    """(speedup, k): the best of (1 + the expected accepted tokens of a k-token draft) ÷ (a (k+1)-row pass ÷ a 1-row
    pass) over the k the acceptance was measured at and the calibration prices; a draft's i-th token survives in the
    share of the drafts that reached it and kept it (Stats.accepted_by_position)."""
    best, tokens = (1.0, 0), 1.0
    if 1 not in seconds:
        return best
    for k, (accepted, drafted) in enumerate(by_position, start=1):
        if not drafted or k + 1 not in seconds:
            break
        tokens += accepted / drafted
        best = max(best, (tokens / (seconds[k + 1] / seconds[1]), k))
    return best


def run_mode(rt: Runtime, suite, mode: str, drafter: str) -> dict:  # type: ignore[no-untyped-def]
    rt.set_drafter("none" if mode == "constrained-none" else drafter)
    PASSES.clear()
    out = {"tokens": 0, "seconds": 0.0, "passes": 0, "grammar": 0.0, "forced": 0, "forced_ok": 0, "valid": 0,
           "ids": {}, "by_position": []}
    for p in suite.prompts:
        rt.fresh()
        spec = None if mode == "free" else p.constraint
        ids, text = [], []
        for e in rt.generate(rt.prompt_tokens(p.prompt), GenerationSettings(max_tokens=p.max_tokens,
                                                                             constraint=spec)):
            if isinstance(e, Step):
                ids += [t.id for t in e.emitted]
                text += [t.text for t in e.emitted]
            elif isinstance(e, Finished):
                s = e.stats
                text.append(e.tail)
        out["ids"][p.id] = ids
        out["tokens"] += s.generated_tokens
        out["seconds"] += s.decode_seconds
        out["passes"] += s.target_passes
        out["grammar"] += s.grammar_seconds
        out["forced"] += s.forced_drafted
        out["forced_ok"] += s.forced_accepted
        for i, (accepted, drafted) in enumerate(s.accepted_by_position):
            while len(out["by_position"]) <= i:
                out["by_position"].append([0, 0])
            out["by_position"][i][0] += accepted
            out["by_position"][i][1] += drafted
        try:
            doc = json.loads("".join(text))
            required = json.loads(p.constraint.text).get("required", []) if p.constraint else []
            out["valid"] += isinstance(doc, dict) and all(k in doc for k in required)
        except ValueError:
            pass
    out["pass_us"] = sorted(t * 1e6 for t in PASSES)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="extract-json")
    ap.add_argument("--drafter", default="auto", choices=("ngram", "auto"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    suite = load_suite(Path(args.suite))
    settings = Settings(args.model, RuntimeSettings(n_gpu_layers=args.gpu_layers, n_ctx=2048),
                        SpeculationSettings(drafter=args.drafter), history=HistorySettings("off"))
    rounds: dict[str, list[dict]] = {m: [] for m in MODES}
    record_passes()
    with Runtime.open(settings) as rt:
        print(f"# {rt.model_name} on {rt.device.description}; suite {args.suite} ({len(suite.prompts)} rows); "
              f"drafter {args.drafter}", flush=True)
        run_mode(rt, suite, "constrained", args.drafter)  # warm-up: the grammar's tokenizer, the policy's costs
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                rounds[mode].append(run_mode(rt, suite, mode, args.drafter))
            line = " · ".join(f"{m} {rounds[m][-1]['tokens'] / rounds[m][-1]['seconds']:.1f} tok/s" for m in MODES)
            print(f"round {r + 1}: {line}", flush=True)
    ref = rounds["constrained-none"][0]["ids"]
    same = all(x["ids"] == ref for x in rounds["constrained"] + rounds["constrained-none"])
    summary = {}
    for m in MODES:
        xs = rounds[m]
        tps = statistics.median(x["tokens"] / x["seconds"] for x in xs)
        x = xs[0]
        each = x["pass_us"] or [0.0]
        summary[m] = {"tok_s": tps, "tokens_a_pass": x["tokens"] / x["passes"],
                      "grammar_us_a_pass": x["grammar"] / x["passes"] * 1e6,
                      "grammar_us_median_pass": statistics.median(each),
                      "grammar_us_p90_pass": each[int(0.9 * (len(each) - 1))], "forced": x["forced"],
                      "forced_accepted": x["forced_ok"], "valid": f"{x['valid']}/{len(suite.prompts)}"}
        print(f"{m:17s} {tps:7.1f} tok/s (median of {len(xs)}) · {summary[m]['tokens_a_pass']:.2f} tokens a pass · "
              f"grammar {summary[m]['grammar_us_a_pass']:.0f} µs a pass (each pass's: median "
              f"{summary[m]['grammar_us_median_pass']:.0f}, p90 {summary[m]['grammar_us_p90_pass']:.0f}) · "
              f"forced {x['forced']} drafted, {x['forced_ok']} accepted · valid {summary[m]['valid']}")
    c, n, f = summary["constrained"], summary["constrained-none"], summary["free"]
    c["bound"], k = bound(rounds["constrained"][0]["by_position"], rt.calibration.seconds if rt.calibration else {})
    print(f"constrained ÷ constrained target-only: {c['tok_s'] / n['tok_s']:.2f}x (its bound {c['bound']:.2f}x, at k = "
          f"{k}) · constrained ÷ free: "
          f"{c['tok_s'] / f['tok_s']:.2f}x · tokens a pass constrained ÷ free: "
          f"{c['tokens_a_pass'] / f['tokens_a_pass']:.2f} · constrained text = target-only text: "
          f"{'all' if same else 'NOT ALL'}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "identical": same}, indent=1))


if __name__ == "__main__":
    main()
