#!/usr/bin/env python3
"""Issue #16's live goal on this machine: the built-in suite as one batch (`--parallel auto`) against the same
prompts one at a time, target-only and with n-gram drafts. Wall time of the whole job, model loads excluded;
rounds alternate the four ways so that a slow minute hits them alike.

    .venv/bin/python scripts/batch_live.py [--rounds 2] [--parallel N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec.batch.request import Request
from localspec.batch.run import run_requests
from localspec.bench.suite import load_suite
from localspec.events import Finished
from localspec.runtime import BatchRuntime, Runtime
from localspec.settings import GenerationSettings, Settings, SpeculationSettings


def one_at_a_time(rt: Runtime, suite) -> tuple[int, float]:  # noqa: ANN001
    tokens, start = 0, time.perf_counter()
    for p in suite.prompts:
        rt.generator.policy.reset()
        for e in rt.generator.generate(rt.prompt_tokens(p.prompt), GenerationSettings(max_tokens=p.max_tokens)):
            if isinstance(e, Finished):
                tokens += e.stats.generated_tokens
    return tokens, time.perf_counter() - start


def as_batch(rt: BatchRuntime, suite) -> tuple[int, float]:  # noqa: ANN001
    requests = [Request(p.id, prompt=p.prompt, max_tokens=p.max_tokens) for p in suite.prompts]
    start = time.perf_counter()
    tokens = sum(len(r.tokens) for r in run_requests(rt, requests))
    return tokens, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None)
    args = ap.parse_args()
    suite = load_suite(None)
    ways = {}
    for drafter in ("none", "ngram"):
        s = Settings(speculation=SpeculationSettings(drafter=drafter))
        ways[f"one at a time, {drafter}"] = (Runtime.open(s), one_at_a_time)
        ways[f"batch, {drafter}"] = (BatchRuntime.open(s, args.parallel, jobs=len(suite.prompts)), as_batch)
    parallel = next(rt.parallel for rt, _ in ways.values() if isinstance(rt, BatchRuntime))
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            rt, how = ways[name]
            tokens, seconds = how(rt, suite)
            rates[name].append(tokens / seconds)
            print(f"round {r + 1}: {name:24s} {tokens} tokens in {seconds:6.1f} s = {tokens / seconds:6.1f} tok/s",
                  flush=True)
    base = statistics.median(rates["one at a time, none"])
    ngram = statistics.median(rates["one at a time, ngram"])
    print(f"\n--parallel {parallel}; median tok/s, and x one at a time target-only / with ngram:")
    for name, values in rates.items():
        m = statistics.median(values)
        print(f"  {name:24s} {m:6.1f}   {m / base:.2f}x   {m / ngram:.2f}x")
    for rt, _ in ways.values():
        rt.close()


if __name__ == "__main__":
    main()
