#!/usr/bin/env python3
"""How close does localspec's n-gram drafter come to the best any prompt-lookup drafter could do?

Generates each suite prompt's greedy target-only output once, measures what a target pass costs per batch size
(speculative/calibrate.py), then replays the outputs offline — no timing noise — with
  - localspec's NgramDrafter + AdaptiveK (seeded with the measured costs), and
  - an oracle: at every step it copies from the earlier occurrence that continues correctly the longest
    (capped at 16 tokens) and drafts exactly that many tokens.
Speedup = target-only cost / replayed cost, from the measured per-pass costs.

    .venv/bin/python scripts/lookup_oracle.py [--suite ../shared/bench/prompts.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from localspec.bench.suite import load_suite
from localspec.drafters.ngram import NgramDrafter
from localspec.events import Step
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings, RuntimeSettings, SamplingSettings, SpeculationSettings
from localspec.speculative.adaptive import AdaptiveK, draft_for
from localspec.speculative.calibrate import measure

K_MAX = 16


def replay_ngram(prompt: list[int], gen: list[int], cost: dict[int, float]) -> float:
    drafter, chooser = NgramDrafter(), AdaptiveK(k_max=K_MAX)
    chooser.calibrate(cost)
    history, pos, total = list(prompt), 0, 0.0
    drafter.begin(history)
    while pos < len(gen):
        draft = draft_for(drafter, history, len(gen) - pos - 1, chooser)
        a = 0
        while a < len(draft.tokens) and draft.tokens[a] == gen[pos + a]:
            a += 1
        pass_cost = cost[len(draft.tokens) + 1]
        total += pass_cost
        chooser.observe(draft.key, draft.drafter, len(draft.tokens), a, 0.0, pass_cost, gen[pos : pos + a + 1])
        history += gen[pos : pos + a + 1]
        pos += a + 1
        drafter.accept(history, a)
    return len(gen) * cost[1] / total


def replay_oracle(prompt: list[int], gen: list[int], cost: dict[int, float]) -> float:
    seq, start, pos, total = prompt + gen, len(prompt), 0, 0.0
    while pos < len(gen):
        here, best = start + pos, 0
        for j in range(here):
            n = 0
            while n < K_MAX and here + n < len(seq) and seq[j + n] == seq[here + n]:
                n += 1
            best = max(best, n)
        k = min(best, len(gen) - pos - 1)
        total += cost[k + 1]
        pos += k + 1
    return len(gen) * cost[1] / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/bench/prompts.jsonl")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    spec = SpeculationSettings(drafter="none")
    with Runtime.open(None, RuntimeSettings(), spec, SamplingSettings()) as rt:
        cost = measure(rt.context, K_MAX + 1)
        print("verify cost per pass, ms:", {n: round(s * 1000, 1) for n, s in cost.items()})
        rows = []
        for p in suite.prompts:
            prompt = rt.prompt_tokens(p.prompt)
            events = rt.generator.generate(prompt, GenerationSettings(max_tokens=p.max_tokens))
            gen = [t.id for e in events if isinstance(e, Step) for t in e.emitted]
            rows.append((p.category, p.id, replay_ngram(prompt, gen, cost), replay_oracle(prompt, gen, cost)))
    for category, pid, ours, oracle in rows:
        print(f"{pid:20s} {category:10s} ngram {ours:.2f}x   oracle {oracle:.2f}x")
    for category in dict.fromkeys(r[0] for r in rows):
        ours = statistics.median(r[2] for r in rows if r[0] == category)
        oracle = statistics.median(r[3] for r in rows if r[0] == category)
        print(f"median {category:10s} ngram {ours:.2f}x   oracle {oracle:.2f}x")


if __name__ == "__main__":
    main()
