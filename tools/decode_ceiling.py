#!/usr/bin/env python3
"""llama-bench-style decode ceiling through llama-cpp-python's low-level API, beside localspec's own loop.

`tg`: decode N tokens one at a time with nothing else in the loop (no logits read, no sampling, like
llama-bench's tg test); `bare`: the same plus a greedy argmax on a logits view; `localspec`: the real
Generator, target-only. Same model, same threads, same process, interleaved repeats, medians.

    .venv/bin/python tools/decode_ceiling.py [--tokens 128] [--repeat 5] [--threads 2]
    .venv/bin/python tools/decode_ceiling.py --profile     # where localspec's per-token time goes (cProfile)

This script touches llama_cpp directly on purpose: it measures what the engine layer costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp
import numpy as np

from localspec.engine import Context, Model
from localspec.models.embedded import ensure_default_model
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.loop import Generator

PROMPT = "The lighthouse on Pell Island was built in 1871 from granite quarried on the mainland."


def tg(ctx: Context, prompt: list[int], n: int, argmax: bool) -> float:
    ctx.clear()
    ctx.decode(prompt)
    token = prompt[-1]
    n_vocab = ctx.n_vocab
    t0 = time.perf_counter()
    for i in range(n):
        batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(token), 1)
        if llama_cpp.llama_decode(ctx.handle, batch) != 0:
            raise RuntimeError("decode failed")
        if argmax:
            ptr = llama_cpp.llama_get_logits_ith(ctx.handle, -1)
            token = int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())
        else:
            token = 236761 + i % 7
    seconds = time.perf_counter() - t0
    ctx.tokens = []  # positions were advanced behind the Context's back; start over next time
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx.handle), True)
    return n / seconds


def localspec_loop(ctx: Context, model: Model, prompt: list[int], n: int) -> float:
    ctx.clear()
    gen = Generator(ctx, model.vocab, [], SamplingSettings())
    for event in gen.generate(prompt, GenerationSettings(max_tokens=n)):
        stats = getattr(event, "stats", None)
    assert stats is not None
    return stats.tokens_per_second


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="cProfile 200 target-only tokens instead")
    args = ap.parse_args()
    with Model(ensure_default_model()) as model, Context(model, n_ctx=1024, n_threads=args.threads) as ctx:
        prompt = model.vocab.tokenize(PROMPT)
        localspec_loop(ctx, model, prompt, 16)  # warm up
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(localspec_loop, ctx, model, prompt, 200)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
            return
        results: dict[str, list[float]] = {"tg": [], "bare": [], "localspec": []}
        for _ in range(args.repeat):
            results["tg"].append(tg(ctx, prompt, args.tokens, argmax=False))
            results["bare"].append(tg(ctx, prompt, args.tokens, argmax=True))
            results["localspec"].append(localspec_loop(ctx, model, prompt, args.tokens))
        ceiling = statistics.median(results["tg"])
        for name, values in results.items():
            med = statistics.median(values)
            runs = ", ".join(f"{v:.1f}" for v in values)
            print(f"{name:10s} {med:6.1f} tok/s  ({med / ceiling:.0%} of tg)  runs: {runs}")


if __name__ == "__main__":
    main()
