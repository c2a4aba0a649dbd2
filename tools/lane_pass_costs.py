#!/usr/bin/env python3
"""What a pass over several sequences costs on this device (the batch scheduler's passes), against one sequence's:
rows R spread over L lanes that each hold C tokens of context, backend greedy where the build has it, fastest of 7.
Each size is timed steady (the same size repeated: a GPU replays its CUDA graph) and, with --after-change, also right
after a pass of another size (no graph: what a change of draft length or of batch rows costs). Run it again with
GGML_CUDA_DISABLE_GRAPHS=1 as the control; on a CPU the two agree.

Then the most drafts can buy a batch of that many lanes on this device: a pass of L lanes and d drafted rows emits
L + a·d tokens where a is the share of drafted rows accepted, so over the steady sizes the best (L + a·d) ÷ cost(L + d)
against plain batching's L ÷ cost(L), for each ``--accept`` share (1: every draft right, the hard ceiling), with
drafts of at most ``--max-depth`` tokens a lane (a share held that deep is already generous). The cost is piecewise
linear between the sizes timed, on which that ratio is monotone: the best lies on a timed size.
``--curve FILE`` reads a run's last line (its JSON) instead of timing, e.g. a GPU's kept output.

    python3 tools/lane_pass_costs.py [--ctx-fill 300] [--lanes 8] [--after-change] [--accept 0.6,0.75,0.9,1]
    python3 tools/lane_pass_costs.py --curve ../shared/gpu/h100-2026-11-25/lane-costs.txt
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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


def ceiling(curve: dict[int, float], lanes: int, accept: float, depth: int) -> tuple[float, int]:
    """The most tokens a second drafts of up to ``depth`` tokens a lane can add to plain batching of ``lanes``
    sequences, as a ratio, where a share ``accept`` of drafted rows is accepted; and the rows a pass where it is
    reached (``lanes``: drafts do not pay)."""
    plain = lanes / curve[lanes]
    best, rows = max(((lanes + accept * (n - lanes)) / seconds, n) for n, seconds in curve.items()
                     if lanes <= n <= lanes * (1 + depth))
    return (best / plain, rows) if best > plain else (1.0, lanes)


def print_ceilings(out: dict[str, dict[int, float]], shares: list[float], depth: int) -> None:
    for name, curve in out.items():
        lanes = int(name.split()[0])
        if "change" in name or lanes == 1 or lanes not in curve:
            continue
        found = [(a, *ceiling(curve, lanes, a, depth)) for a in shares]
        print(f"{lanes} lanes: plain batching {lanes / curve[lanes]:.0f} tokens/s; drafts of up to {depth} tokens a "
              "lane, accepted at " + " · ".join(f"{a:.0%}: ≤ {r:.2f}x ({n} rows)" for a, r, n in found))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx-fill", type=int, default=300)
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--after-change", action="store_true", help="also time each size right after another size")
    ap.add_argument("--accept", default="0.6,0.75,0.9,1",
                    help="shares of drafted rows accepted to price a batch's drafts at (comma-separated)")
    ap.add_argument("--max-depth", type=int, default=4, help="drafted tokens a lane, at most, for the ceiling")
    ap.add_argument("--curve", type=Path, help="a run's output (its last line, the JSON) to read instead of timing")
    args = ap.parse_args()
    shares = [float(a) for a in args.accept.split(",")]
    if args.curve is not None:
        kept = json.loads(args.curve.read_text(encoding="utf-8").strip().splitlines()[-1])
        print_ceilings({name: {int(n): s for n, s in row.items()} for name, row in kept.items()}, shares,
                       args.max_depth)
        return
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
    print_ceilings(out, shares, args.max_depth)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
