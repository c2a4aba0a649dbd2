"""Measure what a target pass costs per batch size on this device, remember it, and say how far to trust it.

The draft-length policy needs verify(n) for every n up to k_max + 1 before it has seen them: on CPU the curve has
steps (batches of a multiple of 4 are cheap, 3 costs more than 4), so guessing it linearly picks bad draft lengths
for the first steps of every run. Measuring takes a few seconds; the result is cached per model and device.

A machine that is busy while it measures (another job, a compile) makes every figure too high, and a cache would
keep them for good. So the sizes are interleaved over several rounds and a low quantile is kept (noise only adds
time); the one-token pass is timed at the start and again at the end; on Linux the CPU time other processes used
meanwhile is read from /proc/stat (machine.OtherLoad). A disturbed measurement is kept but marked provisional, said
so, and measured again at the next start; and the live passes of every run correct the figures
(speculative/costs.py) and write the lower ones back (``Calibration.improve``), each with how and when it was
measured. The figures' file, and where each kind lives, are speculative/calibration_cache.py's.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from localspec.engine import Context, Device
from localspec.machine import OtherLoad
from localspec.models.files import atomic_write_text
from localspec.models.files import say as to_stderr
from localspec.speculative.calibration_cache import Calibration, cache_path, measuring, stamp
from localspec.speculative.costs import low_quantile

ROUNDS = 5  # interleaved rounds over every size, after one that warms caches and allocates graphs
_SINGLES = 8  # one-token passes timed at the start and at the end
_BUSY_CORES = 0.5  # other processes using this many cores meanwhile make a measurement provisional
_DRIFT = 1.25  # a one-token pass this much slower or faster at the end than at the start: the machine changed
_SPREAD = 1.3  # the median round this much slower than the fastest, typically: passes were disturbed
RETRIES = 3  # a provisional calibration is measured again at the next start, this many times in all


Progress = Callable[[int, int], None]  # (passes done, passes in all)


@dataclass
class Reads:
    """How a greedy pass is read back on this device, chosen by timing both: llama.cpp's backend sampler (token ids
    only) or the logits, argmax'd here. The sampler saves a copy of the logits, which pays on a GPU, but on a CPU it
    costs more than it saves, and over RPC it reads every row back in round trips of its own."""

    ids: bool
    seconds: dict[str, dict[int, float]]  # "ids" / "logits" → size → seconds (low quantile of the rounds)
    measured: str

    def describe(self) -> str:
        ids, logits = self.seconds["ids"], self.seconds["logits"]
        pairs = ", ".join(f"{n}: {ids[n] * 1000:.1f} vs {logits[n] * 1000:.1f} ms" for n in sorted(ids))
        return f"{'token ids' if self.ids else 'logits'} (passes of ids vs logits, {pairs}; {self.measured})"


def choose_reads(
    ctx: Context, model_hash: str, device: Device, n_max: int, *, rounds: int = 3,
    again: bool = False, say: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
    settle: bool = False,
) -> Reads | None:
    """Read greedy passes the cheaper way on this device (cached like the pass costs; timed once, in a second or
    two; ``again``: timed now): turns the context's backend sampler on or off (``Context.use_backend_sampler``).
    None where there is no choice (no backend sampler). ``settle``: cached even if the machine was busy (the choice
    names the pass-cost file a batch prices on, which a seeded job must not change from one start to the next)."""
    if not ctx.can_sample or n_max < 1 or not ctx.model.can_rollback:  # timing rolls each pass back
        return None
    path = cache_path(model_hash, device, n_max, "reads")
    reads = None if again else _read_reads(path)
    if reads is None:
        with measuring(path, say):
            reads = None if again else _read_reads(path)  # timed by another process while this one waited
            if reads is None:
                reads = _choose_reads_now(ctx, path, n_max, rounds, say, cancelled, settle, device)
    ctx.use_backend_sampler(reads.ids)
    return reads


def _choose_reads_now(ctx: Context, path: Path, n_max: int, rounds: int, say: Callable[[str], None] | None,
                      cancelled: Callable[[], bool] | None, settle: bool, device: Device) -> Reads:
    """Both ways timed now, and kept where the machine was quiet enough (or ``settle``)."""
    (say or to_stderr)("timing how this device reads a pass back (token ids or logits), once")
    ctx.use_backend_sampler(True)
    load = OtherLoad()
    reads = _time_reads(ctx, n_max, rounds, cancelled, steady=device.graphs)
    others = load.cores()
    # other work meanwhile: used now, timed again at the next start; a read-only cache: the same
    if settle or others is None or others < _BUSY_CORES:
        with contextlib.suppress(OSError):
            atomic_write_text(path, json.dumps({"ids": reads.ids, "measured": reads.measured, "seconds": {
                how: {str(n): t for n, t in by_n.items()} for how, by_n in reads.seconds.items()}}, indent=1))
    return reads


def _read_reads(path: Path) -> Reads | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        seconds = {how: {int(n): float(t) for n, t in data["seconds"][how].items()} for how in ("ids", "logits")}
        return Reads(bool(data["ids"]), seconds, str(data["measured"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _time_reads(ctx: Context, n_max: int, rounds: int, cancelled: Callable[[], bool] | None, *,
                steady: bool = False) -> Reads:
    """Both ways over passes of 1, n_max / 2 and n_max, interleaved over ``rounds`` rounds; each way's first pass
    after a switch is not timed (llama.cpp rebuilds its graph then). ``steady``: each size is timed on its third
    pass in a row, as the loop makes it where CUDA graphs want a steady shape (interleaved, every pass there would
    run without a graph and the choice would be made for passes the loop does not make)."""
    sizes = sorted({1, max(1, n_max // 2), n_max})
    samples: dict[str, dict[int, list[float]]] = {how: {n: [] for n in sizes} for how in ("ids", "logits")}
    with timing_history(ctx, n_max) as tokens:
        for rep in range(rounds):
            for how in ("ids", "logits") if rep % 2 == 0 else ("logits", "ids"):
                timed_pass(ctx, tokens[:1], how == "ids", cancelled)  # llama.cpp rebuilds its graph: not timed
                for n in sizes:
                    samples[how][n].append(timed_pass(ctx, tokens[:n], how == "ids", cancelled, warm=2 * steady))
    seconds = {how: {n: low_quantile(ts) for n, ts in by_n.items()} for how, by_n in samples.items()}
    ids = sum(seconds["ids"].values()) <= sum(seconds["logits"].values())
    return Reads(ids, seconds, f"timed {stamp()}")


def load_or_measure(
    ctx: Context, model_hash: str, device: Device, n_max: int, *,
    say: Callable[[str], None] | None = None, progress: Progress | None = None, again: bool = False,
    retry: bool = True, cancelled: Callable[[], bool] | None = None,
) -> Calibration:
    """This model's pass costs on this device for n = 1..n_max: cached, or measured now (``again``: measured now
    whatever is cached). A provisional cache is measured again (``retry``), at most RETRIES times in all.
    ``cancelled`` is polled between passes: KeyboardInterrupt when it turns true."""
    say = say or to_stderr
    # keyed by the layers really offloaded (``device``): -1 and 999 are the same setting, and a build without GPU
    # offload runs every setting on the CPU. Where CUDA graphs run, each size is timed steady (on its third pass in
    # a row), as the loop keeps it there
    steady = device.graphs
    how = ("argmax" if ctx.backend_sampling else "logits") + ("-steady" if steady else "")
    path = cache_path(model_hash, device, n_max, how)

    def read() -> tuple[Calibration | None, bool]:
        """The cached figures, and whether they serve as they are."""
        cached = None if again else Calibration.read(path)
        if cached is not None and len(cached.seconds) != n_max:
            cached = None
        return cached, cached is not None and (not cached.provisional or not retry or cached.attempts >= RETRIES)

    cached, usable = read()
    if usable:
        assert cached is not None
        return cached
    with measuring(path, say):
        cached, usable = read()  # measured by another process while this one waited
        if usable:
            assert cached is not None
            return cached
        return _measure_and_keep(ctx, path, cached, n_max, device, steady, again, say, progress, cancelled)


def _measure_and_keep(
    ctx: Context, path: Path, cached: Calibration | None, n_max: int, device: Device, steady: bool, again: bool,
    say: Callable[[str], None], progress: Progress | None, cancelled: Callable[[], bool] | None,
) -> Calibration:
    """Measured now and written to ``path``; ``cached``: the disturbed figures measured again."""
    if cached is not None:
        say(f"the last measurement of this machine's pass costs was disturbed ({cached.provisional}): measuring "
            "again")
    what = "measuring this machine's pass costs" + ("" if again or cached is not None else ", once")
    calibration = measure(ctx, n_max, device=device.name, say=say, what=what, progress=progress,
                          cancelled=cancelled, steady=steady)
    calibration.path = path
    if calibration.provisional:
        calibration.attempts = (cached.attempts + 1) if cached is not None else 1
        say(f"the machine was busy while measuring ({calibration.provisional}): the figures are provisional, "
            "corrected as it runs and measured again at the next start")
    if not calibration.save():
        say(f"could not write {path}: the pass costs will be measured again next time")
    return calibration


def measure(
    ctx: Context, n_max: int, *, rounds: int = ROUNDS, device: str = "", say: Callable[[str], None] | None = None,
    what: str = "measuring this machine's pass costs", progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None, steady: bool = False,
) -> Calibration:
    """Time the pass the loop will make for every size 1..n_max: ``rounds`` interleaved rounds after a warm-up,
    the one-token pass before and after; the cache is left as it was found, also when ``cancelled``. ``say`` is
    told ``what`` runs, and for about how long, once the first passes give the estimate. ``steady``: each size is
    timed on its third pass in a row (a GPU replays a CUDA graph only then; interleaved, every figure would be a
    pass without one, ~2x a steady pass of 1 row on an H100)."""
    repeats = 3 if steady else 1
    total = (1 + (rounds + 1) * n_max + 2 * _SINGLES) * repeats
    done = 0

    def timed(n: int) -> float:
        nonlocal done
        # the pass the loop will make: token ids where llama.cpp samples in the graph, else logits
        seconds = timed_pass(ctx, tokens[:n], ctx.backend_sampling, cancelled, warm=repeats - 1)
        done += repeats
        if progress is not None:
            progress(done, total)
        return seconds

    with timing_history(ctx, n_max) as tokens:
        timed(1)  # the first pass allocates the graph
        load = OtherLoad()
        first = [timed(1) for _ in range(_SINGLES)]
        if say is not None:
            # a pass of n tokens costs between one and n single passes; a third of the way is typical on CPU
            guess = low_quantile(first) * (rounds + 1) * repeats * sum(1 + (n - 1) / 3 for n in range(1, n_max + 1))
            say(f"{what}: ~{max(1, round(guess))} s")
        samples: dict[int, list[float]] = {n: [] for n in range(1, n_max + 1)}
        for rep in range(rounds + 1):
            order = list(range(1, n_max + 1))
            if rep % 2:
                order.reverse()  # a machine that speeds up or slows down meanwhile touches every size alike
            for n in order:
                seconds = timed(n)
                if rep:  # the first round warms caches and allocates graphs
                    samples[n].append(seconds)
        last = [timed(1) for _ in range(_SINGLES)]
        others = load.cores()
    seconds = {n: low_quantile(s) for n, s in samples.items()}
    when = stamp()
    how = f"calibration, 25th percentile of {rounds} interleaved rounds{', each size steady' if steady else ''}, {when}"
    return Calibration(seconds, dict.fromkeys(seconds, how), device,
                       _disturbed(others, first, last, samples))


def timed_pass(ctx: Context, tokens: list[int], ids: bool, cancelled: Callable[[], bool] | None, *,
               warm: int = 0) -> float:
    """Seconds to decode ``tokens`` after the cached history, read back as token ids or as logits; the cache is
    left as it was. ``warm``: passes of the same size made first, untimed (2: a steady pass where CUDA graphs run)."""
    for _ in range(warm):
        timed_pass(ctx, tokens, ids, cancelled)
    if cancelled is not None and cancelled():
        raise KeyboardInterrupt
    kept = len(ctx.tokens)
    t0 = time.perf_counter()
    if ids:
        ctx.decode_argmax(tokens)
    else:
        ctx.decode(tokens, all_logits=True)
    seconds = time.perf_counter() - t0
    ctx.truncate(kept)
    return seconds


@contextlib.contextmanager
def timing_history(ctx: Context, n_max: int) -> Iterator[list[int]]:
    """The cache holds 32 tokens of filler while the block times passes of the n_max tokens it is given; then it
    holds what it held before, also when the block is cancelled."""
    filler = ctx.model.vocab.tokenize(" the quick brown fox jumps over the lazy dog" * 4, add_special=True)
    tokens = (filler * (1 + (n_max + 32) // len(filler)))[: n_max + 32]
    saved = list(ctx.tokens)
    ctx.clear()
    try:
        ctx.feed(tokens[:32])
        yield tokens[32:]
    finally:
        ctx.clear()
        if saved:
            ctx.feed(saved)


def _disturbed(others: float | None, first: list[float], last: list[float], samples: Mapping[int, list[float]]) -> str:
    """Why a measurement cannot be trusted ("" if it can): other processes' CPU use, a one-token pass that cost
    differently at the end than at the start, or rounds that disagree."""
    if others is not None and others >= _BUSY_CORES:
        return f"other processes used {others:.1f} cores"
    start, end = low_quantile(first), low_quantile(last)
    if max(start, end) > _DRIFT * min(start, end):
        return f"a one-token pass took {start * 1000:.1f} ms at the start and {end * 1000:.1f} ms at the end"
    spread = statistics.median(statistics.median(s) / min(s) for s in samples.values() if s)
    if spread > _SPREAD:
        return f"passes of the same size varied by {100 * (spread - 1):.0f}%"
    return ""


