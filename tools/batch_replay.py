#!/usr/bin/env python3
"""The batch goals of issue #16, replayed on every shipped cost table: the built-in suite's 16 prompts as one batch
against the same prompts one at a time, target-only and with n-gram drafts.

    .venv/bin/python tools/batch_replay.py            # greedy outputs generated once (cached in bench-out/)

The outputs are generated live once (greedy, target-only, as a batch); a replay drafts them again and prices each
pass on a table (bench/replay.py), so the numbers judge the scheduler and the policy for a device, not this CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from localspec.bench.parallel import as_batch
from localspec.bench.replay import Known, load_cost_table, replay_batch, shipped_tables
from localspec.bench.suite import load_suite
from localspec.runtime import BatchRuntime
from localspec.settings import GenerationSettings, HistorySettings, Settings, SpeculationSettings
from localspec.speculative.costs import PassCosts, auto_parallel

OUT = Path("bench-out/batch-outputs.json")


def outputs() -> list[Known]:
    if OUT.exists():
        return [Known(**k) for k in json.loads(OUT.read_text())]
    # the history off: a measurement neither drafts from nor writes into the user's history
    settings = Settings(speculation=SpeculationSettings(drafter="none"), generation=GenerationSettings(),
                        history=HistorySettings("off"))
    known: list[Known] = []
    with BatchRuntime.open(settings, 8) as rt:
        as_batch(rt, load_suite(None), known)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps([{"prompt": k.prompt, "output": k.output, "eog": k.eog} for k in known]))
    return known


def main() -> None:
    known = outputs()
    print(f"{len(known)} prompts, {sum(len(k.output) for k in known)} tokens")
    for name in sorted(shipped_tables()):
        table = load_cost_table(name)
        auto = auto_parallel(PassCosts(table.calibration(17)), 8)
        alone = replay_batch("none", known, table, 1)
        alone_ngram = replay_batch("ngram", known, table, 1)
        print(f"\n{name} ({table.device}); --parallel auto = {auto}")
        print(f"  one at a time  target-only {alone.tokens_per_second:8.1f} tok/s   ngram "
              f"{alone_ngram.tokens_per_second:8.1f} ({alone_ngram.tokens_per_second / alone.tokens_per_second:.2f}x)")
        for p in sorted({2, 4, 8, 16, auto}):
            plain = replay_batch("none", known, table, p)
            spec = replay_batch("ngram", known, table, p)
            one, spec_rate, plain_rate = alone.tokens_per_second, spec.tokens_per_second, plain.tokens_per_second
            print(f"  parallel {p:2d}    plain {plain_rate:8.1f} ({plain_rate / one:.2f}x)   ngram {spec_rate:8.1f} "
                  f"({spec_rate / one:.2f}x one at a time, {spec_rate / plain_rate:.2f}x plain batching)   "
                  f"rows/pass {spec.rows / spec.passes:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
