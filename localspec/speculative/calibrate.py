"""Measure what a target pass costs per batch size, once per model and machine setting, and remember it.

The adaptive chooser needs verify(n) for every n up to k_max + 1 before it has seen them: on CPU the curve has
steps (batches of a multiple of 4 are cheap), so guessing it linearly picks bad draft lengths for the first
steps of every run. Measuring takes a couple of seconds; the result is cached next to the models.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from localspec.engine import Context, library_version
from localspec.engine.backend import offloaded_layers
from localspec.hub import atomic_write_text
from localspec.paths import cache_dir

# The fastest of these: timing noise only ever adds. The chooser starts from these minima and moves each batch size
# it uses towards typical live costs, so batch sizes it has not tried look a little cheap until it tries them.
_REPEATS = 3
_METHOD = "min3"  # in the cache file's name: figures measured another way are not reused


def _cache_file(model_hash: str, threads: int, gpu_layers: int, n_max: int) -> Path:
    name = f"{model_hash[:16]}-t{threads}-g{gpu_layers}-n{n_max}-{library_version()}-{_METHOD}.json"
    return cache_dir() / "calibration" / name


def verify_costs(ctx: Context, model_hash: str, threads: int, gpu_layers: int, n_max: int) -> dict[int, float]:
    """Seconds for one pass over n tokens with logits at every position, n = 1..n_max (cached)."""
    # Keyed by the layers really offloaded: -1 and 999 are the same setting, and a build without GPU offload
    # runs every setting on the CPU.
    path = _cache_file(model_hash, threads, offloaded_layers(gpu_layers, ctx.model.n_layer), n_max)
    try:
        return {int(n): float(s) for n, s in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        pass
    print("localspec: measuring verification costs for this model (once)…", file=sys.stderr)
    costs = measure(ctx, n_max)
    atomic_write_text(path, json.dumps(costs))
    return costs


def measure(ctx: Context, n_max: int) -> dict[int, float]:
    vocab = ctx.model.vocab
    filler = vocab.tokenize(" the quick brown fox jumps over the lazy dog" * 4, add_special=True)
    tokens = (filler * (1 + (n_max + 32) // len(filler)))[: n_max + 32]
    saved = list(ctx.tokens)
    ctx.clear()
    ctx.decode(tokens[:32])
    samples: dict[int, list[float]] = {}
    for rep in range(_REPEATS + 1):
        for n in range(1, n_max + 1):
            t0 = time.perf_counter()
            ctx.decode(tokens[32 : 32 + n], all_logits=True)
            seconds = time.perf_counter() - t0
            ctx.truncate(32)
            if rep:  # the first round warms caches and allocates graphs
                samples.setdefault(n, []).append(seconds)
    ctx.clear()
    if saved:
        ctx.decode(saved)
    return {n: min(s) for n, s in samples.items()}
