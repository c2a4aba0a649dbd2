"""Measure what a target pass costs per batch size, once per model and machine setting, and remember it.

The draft-length policy needs verify(n) for every n up to k_max + 1 before it has seen them: on CPU the curve has
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
from localspec.models.files import atomic_write_text
from localspec.paths import cache_dir

# The fastest of these: timing noise only ever adds. The policy starts from these minima; the excess of live steps
# over them it learns as it goes (policy._VerifyCost).
_REPEATS = 3
_METHOD = "min3"  # in the cache file's name: figures measured another way are not reused


def _cache_file(model_hash: str, threads: int, gpu_layers: int, n_max: int, argmax: bool) -> Path:
    # passes that return token ids (backend sampling) and passes that return logits cost differently
    how = "argmax" if argmax else "logits"
    name = f"{model_hash[:16]}-t{threads}-g{gpu_layers}-n{n_max}-{library_version()}-{_METHOD}-{how}.json"
    return cache_dir() / "calibration" / name


def verify_costs(ctx: Context, model_hash: str, threads: int, gpu_layers: int, n_max: int) -> dict[int, float]:
    """Seconds for one pass over n tokens with logits at every position, n = 1..n_max (cached)."""
    # Keyed by the layers really offloaded: -1 and 999 are the same setting, and a build without GPU offload
    # runs every setting on the CPU.
    layers = offloaded_layers(gpu_layers, ctx.model.n_layer)
    path = _cache_file(model_hash, threads, layers, n_max, ctx.backend_sampling)
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
    ctx.feed(tokens[:32])
    samples: dict[int, list[float]] = {}
    for rep in range(_REPEATS + 1):
        for n in range(1, n_max + 1):
            batch = tokens[32 : 32 + n]
            t0 = time.perf_counter()
            # the pass the loop will make: token ids where llama.cpp samples in the graph, else logits
            ctx.decode_argmax(batch) if ctx.backend_sampling else ctx.decode(batch, all_logits=True)
            seconds = time.perf_counter() - t0
            ctx.truncate(32)
            if rep:  # the first round warms caches and allocates graphs
                samples.setdefault(n, []).append(seconds)
    ctx.clear()
    if saved:
        ctx.feed(saved)
    return {n: min(s) for n, s in samples.items()}
