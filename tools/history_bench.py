#!/usr/bin/env python3
"""The history store's speed and size at a million cached tokens (issue 34's goals: a lookup <= 50 us a step,
median; <= 200 MB of its own; loaded in <= 0.5 s). A benchmark, not a test: run it on a quiet machine.

    PYTHONPATH=. python tools/history_bench.py [--tokens 1000000]

It fills a history with templated sequences (a fixed skeleton with varying items, like a scripted job's), saves it
to a temporary folder (never the user's cache), loads it back, and times lookups at the suffixes of fresh sequences
of the same shape. Self-contained: it needs only localspec's history package and numpy.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from localspec.history.history import Added, History


def sequences(rng: np.random.Generator, n_tokens: int, vocab: int = 262_144) -> list[list[int]]:
    """Templated sequences of 400 tokens: 16 skeleton pieces of 20 tokens, each followed by 5 varying tokens."""
    fixed = np.random.default_rng(7)  # one skeleton for every call: the probes share the job's template
    skeleton = [fixed.integers(0, vocab, 20).tolist() for _ in range(16)]
    out, total = [], 0
    while total < n_tokens:
        seq: list[int] = []
        for piece in skeleton:
            seq += piece + rng.integers(0, vocab, 5).tolist()
        out.append(seq)
        total += len(seq)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=5000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    seqs = sequences(rng, args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.npz"
        history = History("bench", path, max_tokens=args.tokens + 1000)
        t0 = time.perf_counter()
        shelf = history.shelf("local")  # filled in one merge: feeding a million tokens one sequence at a time
        shelf.extend(seqs, list(range(len(seqs))))  # costs a merge per sequence (what a feed at this size costs:
        history.serial = len(seqs)  # timed below)
        history.added = [Added("local", np.empty(0, np.int32), 0)]  # something to save
        fed = time.perf_counter() - t0
        history.save()
        size = path.stat().st_size
        t0 = time.perf_counter()
        loaded = History.open("bench", path, max_tokens=args.tokens + 1000)
        load_s = time.perf_counter() - t0
        assert loaded.n_tokens == history.n_tokens, loaded.notices
        view = loaded.view()
        probes = sequences(np.random.default_rng(1), 400 * 20)  # the same skeleton, other items: never fed
        repeat = args.lookups // len(probes) + 1
        tails = [seq[: int(rng.integers(20, len(seq)))] for seq in probes for _ in range(repeat)]
        tails = tails[: args.lookups]
        times, hits = [], 0
        for tail in tails:
            t0 = time.perf_counter()
            match = view.lookup(tail, 16)
            times.append(time.perf_counter() - t0)
            hits += match is not None
        # a feed at this size: one more sequence merged into every index
        t0 = time.perf_counter()
        loaded.feed(seqs[0])
        feed_one = time.perf_counter() - t0
    print(f"tokens cached: {history.n_tokens:,} in {history.n_requests:,} sequences (filled in {fed:.1f} s)")
    print(f"memory of its own: {history.nbytes() / 1e6:.1f} MB ({history.nbytes() / history.n_tokens:.0f} B a token); "
          f"file {size / 1e6:.1f} MB")
    print(f"load: {load_s:.3f} s")
    print(f"lookup: median {statistics.median(times) * 1e6:.1f} us, p90 "
          f"{sorted(times)[int(0.9 * len(times))] * 1e6:.1f} us over {len(times)} steps ({hits} found a match)")
    print(f"feeding one more sequence at this size: {feed_one * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
