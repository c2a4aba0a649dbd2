"""Measure what a target pass costs per batch size on this device, remember it, and say how far to trust it.

The draft-length policy needs verify(n) for every n up to k_max + 1 before it has seen them: on CPU the curve has
steps (batches of a multiple of 4 are cheap, 3 costs more than 4), so guessing it linearly picks bad draft lengths
for the first steps of every run. Measuring takes a few seconds; the result is cached per model and device.

A machine that is busy while it measures (another job, a compile) makes every figure too high, and a cache would
keep them for good. So the sizes are interleaved over several rounds and a low quantile is kept (noise only adds
time); the one-token pass is timed at the start and again at the end; on Linux the CPU time other processes used
meanwhile is read from /proc/stat. A disturbed measurement is kept but marked provisional, said so, and measured
again at the next start; and the live passes of every run correct the figures (speculative/costs.py) and write
the lower ones back (``Calibration.improve``), each with how and when it was measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar

from localspec.engine import Context, Device, library_version
from localspec.models.files import atomic_write_text
from localspec.models.files import say as to_stderr
from localspec.paths import cache_dir
from localspec.speculative.costs import MIN_PASSES, PassCosts, low_quantile

ROUNDS = 5  # interleaved rounds over every size, after one that warms caches and allocates graphs
_METHOD = "q5"  # in the cache file's name: figures measured another way are not reused
_SINGLES = 8  # one-token passes timed at the start and at the end
_BUSY_CORES = 0.5  # other processes using this many cores meanwhile make a measurement provisional
_DRIFT = 1.25  # a one-token pass this much slower or faster at the end than at the start: the machine changed
_SPREAD = 1.3  # the median round this much slower than the fastest, typically: passes were disturbed
RETRIES = 3  # a provisional calibration is measured again at the next start, this many times in all
_IMPROVES = 0.95  # a live figure replaces a stored one when it is at least 5% lower


Progress = Callable[[int, int], None]  # (passes done, passes in all)


@dataclass
class Calibration:
    """Seconds per target pass by tokens in the pass, for one model on one device setting, with how and when each
    figure was measured, and whether the machine was quiet enough to trust them."""

    seconds: dict[int, float]
    measured: dict[int, str]  # size → how and when ("calibration, 2nd lowest of 5 rounds, 2026-11-23 20:31")
    device: str
    provisional: str = ""  # why the figures may be too high ("": measured on a quiet machine)
    attempts: int = 1  # measurements so far that came out provisional, plus one
    path: Path | None = field(default=None, compare=False)
    # the figures as the last measurement took them, which live passes never change (``improve`` leaves them): a
    # seeded sampled request prices on these, so its pass sizes do not follow what earlier runs wrote back
    as_measured: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.as_measured:  # a file written before they were kept: its figures as read stand for them
            self.as_measured = dict(self.seconds)

    def to_json(self) -> str:
        return json.dumps({
            "format": 2, "device": self.device, "provisional": self.provisional, "attempts": self.attempts,
            "seconds_by_batch": {str(n): s for n, s in sorted(self.seconds.items())},
            "measured": {str(n): m for n, m in sorted(self.measured.items())},
            "as_measured_by_batch": {str(n): s for n, s in sorted(self.as_measured.items())},
        }, indent=1)

    @classmethod
    def read(cls, path: Path) -> Calibration | None:
        """The calibration cached at ``path``; None if there is none or it cannot be read (it is measured anew)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            seconds = {int(n): float(s) for n, s in data["seconds_by_batch"].items()}
            measured = {int(n): str(m) for n, m in data.get("measured", {}).items()}
            as_measured = {int(n): float(s) for n, s in data.get("as_measured_by_batch", {}).items()}
            if not seconds or sorted(seconds) != list(range(1, len(seconds) + 1)) or min(seconds.values()) <= 0:
                return None  # damaged: measured anew
            if as_measured and (sorted(as_measured) != sorted(seconds) or min(as_measured.values()) <= 0):
                as_measured = {}  # damaged: the figures as read stand for them
            return cls(seconds, measured, str(data.get("device", "")), str(data.get("provisional", "")),
                       int(data.get("attempts", 1)), path, as_measured)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save(self) -> bool:
        """Write the file; False if it cannot be written (the figures still serve this run)."""
        if self.path is None:
            return False
        try:
            atomic_write_text(self.path, self.to_json())
        except OSError:
            return False
        return True

    def improve(self, costs: PassCosts) -> list[int]:
        """Take what live passes proved: a size's own figure where it is clearly lower than the stored one (a live
        pass costs at least the bare pass), and, where the live level says every pass runs faster than calibrated,
        the stored figure at that level for the sizes no pass used (else, next time, the sizes written back would
        set the level at 1 again and the rest would look as dear as before). Returns the sizes changed."""
        when, level, live = _now(), costs.level(), costs.live()
        changed = []
        for n, stored in self.seconds.items():
            seconds, passes = live.get(n, (0.0, 0))
            if passes >= MIN_PASSES:
                how = f"live, 25th percentile of {passes} passes, {when}"
            else:
                seconds, how = stored * level, f"{self.measured.get(n, 'calibration')}; × {level:.2f} live, {when}"
            if seconds < stored * _IMPROVES:
                self.seconds[n], self.measured[n] = seconds, how
                changed.append(n)
        return changed


def cache_path(model_hash: str, device: Device, n_max: int, what: str) -> Path:
    """Where the figures of ``what`` ("argmax", "logits", either + "-steady"; "reads"; "shapes") for passes of up to
    ``n_max`` tokens of this model on ``device`` are cached. Keep the names as they are: a new localspec finds the
    figures a user's machine measured before (a new llama-cpp-python, whose version is in them, measures anew)."""
    # passes that return token ids (backend sampling) and passes that return logits cost differently; the device is
    # in the name because the CPU behind a machine can change from one day to the next
    slug = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")[:48] or "unknown"
    name = (f"{model_hash[:16]}-{slug}-t{device.threads}-g{device.gpu_layers}-n{n_max}-{library_version()}-{_METHOD}"
            f"-{what}.json")
    return cache_dir() / "calibration" / name


class _Cacheable(Protocol):
    def to_json(self) -> str: ...


C = TypeVar("C", bound=_Cacheable)


def cached(path: Path, read: Callable[[Path], C | None], measure: Callable[[], C], what: str, *, again: bool = False,
           say: Callable[[str], None] | None = None) -> C:
    """The figures cached at ``path`` (``read``: None where there are none or they cannot be used), or measured now,
    saying ``what`` is measured, and cached (a cache that cannot be written costs only the next run's measurement)."""
    found = None if again else read(path)
    if found is None:
        (say or to_stderr)(what)
        found = measure()
        with contextlib.suppress(OSError):
            atomic_write_text(path, found.to_json())
    return found


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
        (say or to_stderr)("timing how this device reads a pass back (token ids or logits), once")
        ctx.use_backend_sampler(True)
        load = _OtherLoad()
        reads = _time_reads(ctx, n_max, rounds, cancelled, steady=device.graphs)
        others = load.cores()
        # other work meanwhile: used now, timed again at the next start; a read-only cache: the same
        if settle or others is None or others < _BUSY_CORES:
            with contextlib.suppress(OSError):
                atomic_write_text(path, json.dumps({"ids": reads.ids, "measured": reads.measured, "seconds": {
                    how: {str(n): t for n, t in by_n.items()} for how, by_n in reads.seconds.items()}}, indent=1))
    ctx.use_backend_sampler(reads.ids)
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
    return Reads(ids, seconds, f"timed {_now()}")


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
    cached = None if again else Calibration.read(path)
    if cached is not None and len(cached.seconds) != n_max:
        cached = None
    if cached is not None and (not cached.provisional or not retry or cached.attempts >= RETRIES):
        return cached
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
        load = _OtherLoad()
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
    when = _now()
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


class _OtherLoad:
    """The CPU time other processes use from now on, in cores (Linux: /proc/stat; None where it cannot tell)."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), _system_busy(), _own_cpu())

    def cores(self) -> float | None:
        wall0, busy0, own0 = self._start
        busy1 = _system_busy()
        if busy0 is None or busy1 is None:
            return None
        wall = time.monotonic() - wall0
        return max(0.0, (busy1 - busy0) - (_own_cpu() - own0)) / wall if wall > 0 else None


def _system_busy() -> float | None:
    """CPU seconds every process has used since boot on the cores this process may run on (another process pinned
    to other cores does not slow it), steal time (the hypervisor's other guests) included."""
    try:
        mine = {f"cpu{n}" for n in os.sched_getaffinity(0)}
    except AttributeError:  # not Linux: the machine's total line
        mine = None
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    rows = [line for line in lines[1:] if line[0] in mine] if mine else lines[:1]
    try:
        total = 0
        for row in rows or lines[:1]:
            user, nice, system, _idle, _iowait, irq, softirq, steal = ([int(x) for x in row[1:]] + [0] * 8)[:8]
            total += user + nice + system + irq + softirq + steal
    except ValueError:
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M")
