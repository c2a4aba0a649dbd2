#!/usr/bin/env python3
"""What a pass over several sequences costs on this device (the batch scheduler's passes), against one sequence's:
rows R spread over L lanes that each hold C tokens of context, backend greedy where the build has it, fastest of 7.
Each size is timed steady (the same size repeated: a GPU replays its CUDA graph) and, with --after-change, also right
after a pass of another size (no graph: what a change of draft length or of batch rows costs). Run it again with
GGML_CUDA_DISABLE_GRAPHS=1 as the control; on a CPU the two agree.

    python3 tools/lane_pass_costs.py [--ctx-fill 300] [--lanes 8] [--after-change]
"""

from __future__ import annotations

import argparse
import json
import time

import localspec  # noqa: F401  (llama.cpp's libraries before numpy)
from localspec.engine import Context, Model
from localspec.engine.lanes import Lanes
from localspec.models.embedded import ensure_default_model
from localspec.settings import Settings


def timed(ctx: Context, lanes_n: int, rows: int, fill: int) -> float:
    """Seconds for one pass of ``rows`` rows spread over ``lanes_n`` lanes after ``fill`` cached tokens each, read
    back; the lanes are left as they were."""
    per = [rows // lanes_n + (1 if i < rows % lanes_n else 0) for i in range(lanes_n)]
    parts = [(s, fill, [200 + j for j in range(m)], True) for s, m in enumerate(per) if m]
    t = time.perf_counter()
    starts = ctx.decode_parts(parts)
    for (_, _, toks, _), st in zip(parts, starts, strict=True):
        ctx.sampled_rows(st, len(toks)) if ctx.backend_sampling else ctx.logits_rows(st, len(toks))
    seconds = time.perf_counter() - t
    for s in range(lanes_n):
        ctx.seq_drop(s, fill)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx-fill", type=int, default=300)
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--after-change", action="store_true", help="also time each size right after another size")
    args = ap.parse_args()
    rt = Settings().runtime
    model = Model(ensure_default_model(progress=False), n_gpu_layers=rt.n_gpu_layers)
    out: dict[str, dict[int, float]] = {}
    for lanes_n in (1, args.lanes):
        lanes = Lanes(model, lanes_n, n_ctx=1024, n_threads=rt.threads(), n_batch=512, max_rows=256)
        ctx = lanes.context
        for s in range(lanes_n):
            ctx.set_backend_greedy(s, True) if ctx.backend_sampling else None
            for p in range(0, args.ctx_fill, 100):
                ctx.decode_parts([(s, p, [100 + (p + i) % 500 for i in range(100)], False)])
        sizes = [r for r in (1, 2, 4, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128) if r >= lanes_n]
        row = {rows: min(timed(ctx, lanes_n, rows, args.ctx_fill) for _ in range(7)) for rows in sizes}
        out[f"{lanes_n} lanes"] = row
        print(lanes_n, "lanes, steady:", " · ".join(f"{r} {t * 1e3:.2f}" for r, t in row.items()), "ms", flush=True)
        if args.after_change:
            changed = {}
            for rows in sizes:
                times = []
                for _ in range(7):
                    timed(ctx, lanes_n, rows + 1, args.ctx_fill)  # another size: the graph (and a CUDA graph) changes
                    times.append(timed(ctx, lanes_n, rows, args.ctx_fill))
                changed[rows] = min(times)
            out[f"{lanes_n} lanes, after a change"] = changed
            print(lanes_n, "lanes, after a change:", " · ".join(f"{r} {t * 1e3:.2f}" for r, t in changed.items()),
                  "ms", flush=True)
        ctx.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
