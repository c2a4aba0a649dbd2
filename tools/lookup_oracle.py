#!/usr/bin/env python3
"""How close does localspec's n-gram drafter come to the best any prompt-lookup drafter could do?

Generates each suite prompt's greedy target-only output once, measures what a target pass costs per batch size
(speculative/calibrate.py), then replays the outputs offline — no timing noise — with
  - localspec's NgramDrafter + AdaptiveK (seeded with the measured costs),
  - llama.cpp's `llama-lookup` drafting, re-implemented from common/ngram-cache.cpp (the context n-gram cache
    of 1- to 4-grams with token counts, its "lax" count/percent thresholds, no static or dynamic cache files),
    with up to 8 drafted tokens (as NOTES.md measured it) and up to 16 (its current default, and localspec's
    k_max), so the drafters meet on the same outputs and costs. Count ties go to the most recent continuation
    (llama.cpp takes the first in hash-map order, which is unspecified), and
  - an oracle: at every step it copies from the earlier occurrence that continues correctly the longest
    (capped at 16 tokens) and drafts exactly that many tokens.
Speedup = target-only cost / replayed cost, from the measured per-pass costs, and again from the costs NOTES.md
gives for the team's other machine (20 / 31 / 48 / 70 ms for 1 / 4 / 8 / 16 tokens, interpolated linearly), where
the single-token pass is relatively dearer and so long drafts pay more.

    .venv/bin/python tools/lookup_oracle.py [--suite ../shared/bench/prompts.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from localspec.bench.replay import CostTable, replay
from localspec.bench.replay import replay_oracle as oracle
from localspec.bench.suite import load_suite
from localspec.events import Step
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings, HistorySettings, Settings, SpeculationSettings
from localspec.speculative.calibrate import measure

K_MAX = 16
NOTES_COSTS = {1: 0.020, 4: 0.031, 8: 0.048, 16: 0.070}


def notes_costs() -> dict[int, float]:
    known = sorted(NOTES_COSTS)
    out = {}
    for n in range(1, K_MAX + 2):
        lo = max(m for m in known if m <= n)
        hi = min((m for m in known if m > n), default=None)
        if hi is None:  # past the last point: the slope of the last segment
            hi, lo = lo, max(m for m in known if m < lo)
        out[n] = NOTES_COSTS[lo] + (NOTES_COSTS[hi] - NOTES_COSTS[lo]) * (n - lo) / (hi - lo)
    return out


def replay_ngram(prompt: list[int], gen: list[int], cost: dict[int, float]) -> float:
    table = CostTable("", cost)
    plain = replay("none", prompt, gen, table).decode_seconds
    return plain / replay("ngram", prompt, gen, table, k_max=K_MAX).decode_seconds


def replay_llama_lookup(prompt: list[int], gen: list[int], cost: dict[int, float], n_draft: int = 8) -> float:
    # common_ngram_cache_draft with only the context cache; thresholds per n-gram size 1..4 (the "lax" set)
    min_samples, min_percent = (2, 2, 1, 1), (66, 50, 50, 50)
    counts: dict[tuple[int, ...], dict[int, tuple[int, int]]] = {}  # n-gram -> next token -> (count, last seen)

    def learn(seq: list[int], start: int) -> None:  # common_ngram_cache_update for the tokens from `start` on
        for n in range(1, 5):
            for i in range(max(start, n), len(seq)):
                part = counts.setdefault(tuple(seq[i - n : i]), {})
                part[seq[i]] = (part.get(seq[i], (0, 0))[0] + 1, i)

    def next_token(seq: list[int]) -> int | None:
        for n in range(4, 0, -1):  # the longest n-gram first
            part = counts.get(tuple(seq[-n:]))
            if not part:
                continue
            token, (best, _) = max(part.items(), key=lambda kv: kv[1])
            total = sum(c for c, _ in part.values())
            if total >= min_samples[n - 1] and 100 * best >= min_percent[n - 1] * total:
                return token
        return None

    history, pos, total = list(prompt), 0, 0.0
    learn(history, 0)
    while pos < len(gen):
        draft: list[int] = []
        while len(draft) < min(n_draft, len(gen) - pos - 1):
            token = next_token(history + draft)
            if token is None:
                break
            draft.append(token)
        a = 0
        while a < len(draft) and draft[a] == gen[pos + a]:
            a += 1
        total += cost[len(draft) + 1]
        before = len(history)
        history += gen[pos : pos + a + 1]
        learn(history, before)
        pos += a + 1
    return len(gen) * cost[1] / total


def replay_oracle(prompt: list[int], gen: list[int], cost: dict[int, float]) -> float:
    table = CostTable("", cost)
    return replay("none", prompt, gen, table).decode_seconds / oracle(prompt, gen, table, K_MAX).decode_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/bench/prompts.jsonl")
    args = ap.parse_args()
    suite = load_suite(args.suite)
    spec = SpeculationSettings(drafter="none")
    with Runtime.open(Settings(speculation=spec, history=HistorySettings("off"))) as rt:  # the user's stays untouched
        cost = measure(rt.context, K_MAX + 1)
        print("verify cost per pass, ms:", {n: round(s * 1000, 1) for n, s in cost.items()})
        rows = []
        notes = notes_costs()
        for p in suite.prompts:
            prompt = rt.prompt_tokens(p.prompt)
            events = rt.generator.generate(prompt, GenerationSettings(max_tokens=p.max_tokens))
            gen = [t.id for e in events if isinstance(e, Step) for t in e.emitted]
            rows.append((p.category, p.id, *(f(prompt, gen, c) for c in (cost, notes) for f in REPLAYS.values())))
    half = len(REPLAYS) * 11
    print(f"{'':31s} {'this machine':>{half}s}   {'NOTES.md costs':>{half}s}")
    print(f"{'':31s} " + _cells([*REPLAYS, *REPLAYS]))
    for category, pid, *speedups in rows:
        print(f"{pid:20s} {category:10s} " + _cells(speedups))
    for category in dict.fromkeys(r[0] for r in rows):
        medians = [statistics.median(r[i] for r in rows if r[0] == category) for i in range(2, 2 + 2 * len(REPLAYS))]
        print(f"{'median ' + category:31s} " + _cells(medians))


REPLAYS = {
    "ngram": replay_ngram,
    "lookup/8": replay_llama_lookup,
    "lookup/16": lambda prompt, gen, cost: replay_llama_lookup(prompt, gen, cost, n_draft=16),
    "oracle": replay_oracle,
}


def _cells(cells: list[float] | list[str]) -> str:
    text = [c if isinstance(c, str) else f"{c:.2f}x" for c in cells]
    n = len(REPLAYS)
    return " ".join(f"{t:>10s}" for t in text[:n]) + "   " + " ".join(f"{t:>10s}" for t in text[n:])


if __name__ == "__main__":
    main()
