"""What a target pass over n tokens costs on this device, as the loop lives it: the calibration, corrected by the
passes the loop really makes.

A calibration times bare passes once, and may have been taken while the machine was busy; a live pass costs a
little more (the step's own work, the rollback) and is now and then much slower (another process took a core). Two
rules keep one slow pass, or one busy minute, from steering the draft length:

- **Noise only adds time**, so every figure is a low quantile of recent passes, never a mean, and a size needs a
  few passes of its own before its figure replaces the calibration's.
- **The calibration keeps its shape, the live passes set its level.** Sizes the loop has not used lately are the
  calibrated figure times a low quantile of the ratio live ÷ calibrated over recent passes: a calibration taken
  under load (every figure 2–3x too high) is scaled down within a few dozen passes, whatever sizes the policy
  happens to use. The shape is kept as measured: on CPUs, a pass of 3 tokens costs more than one of 4, and
  flattening it loses speed.

A size's own passes are set aside once the machine runs calmer than when they were taken (the level has fallen), and
expire after a long while in any case, so a size the policy stopped using while the machine was busy is priced again
from the level of the recent passes, not from its busy figure forever (a lock that used to switch drafting off for
the rest of a generation: the policy never drafts at a size that looks dear, so it never sees it get cheap again).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 9  # recent passes kept per size
MIN_PASSES = 3  # passes of its own before a size's figure replaces the calibration's: one slow pass never stands alone
LEVEL_WINDOW = 32  # recent passes that say how fast the machine runs now, relative to the calibration
DRAFT_LEVEL_PASSES = 8  # draft passes among them before they alone set the level
STALE_AFTER = 1024  # passes after which a size's own passes are forgotten (the machine may have changed since)
CALMER = 1.25  # a size's passes taken while the level was this much higher than now are of a busier machine
SWEEP_EVERY = 64  # passes between recomputing every size's figure (expiry; the level moving recomputes them too)
# --parallel auto looks no further: each lane holds a --ctx of KV cache (docs/batch.md prices it)
PARALLEL_AUTO_MAX = 8
# ... and takes the fewest lanes that reach this share of the best throughput the cost curve promises
PARALLEL_AUTO_SHARE = 0.95


def low_quantile(values: list[float]) -> float:
    """About the 25th percentile: the quiet cost of a pass whose noise only ever adds."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


@dataclass(slots=True)
class PassCosts:
    """Seconds per target pass by tokens in the pass; ``update`` after every pass, call it for any size."""

    calibrated: dict[int, float] = field(default_factory=dict)
    # rows past the calibration (a batch's passes) at the slope of the measured curve's top, not each row's share of
    # the largest size: set where the device keeps pass shapes (a GPU, whose passes of hundreds of rows cost tens of
    # milliseconds). A CPU keeps the share rule: there it prices those rows too high (128 rows ~700 ms against
    # 524-559 ms measured), and that is what keeps a server's passes short: priced nearer the truth, 8 clients got
    # no more tokens a second and waited a second longer for first tokens (docs/performance-notes.md at
    # 1a3f1f9, "Pass shapes, continued")
    wide_slope: bool = False
    # priced on ``calibrated`` alone, never corrected by live passes (``update`` does nothing): what a seeded sampled
    # request prices on, so that its pass sizes, which move llama.cpp's logits, are the same run after run
    frozen: bool = False
    # size → (pass number, the level then, seconds)
    _passes: dict[int, deque[tuple[int, float, float]]] = field(default_factory=dict)
    _ratios: deque[tuple[bool, float]] = field(default_factory=lambda: deque(maxlen=LEVEL_WINDOW))
    _count: int = 0
    # derived, kept up to date by ``update`` so that a step pays for the size it used, not for all of them
    _level: float = 1.0
    _own: dict[int, tuple[float, int]] = field(default_factory=dict)  # size → (figure, passes it rests on)
    _swept: tuple[int, float] = (0, 1.0)  # (pass number, level) when every size's figure was last recomputed
    _curve: list[float] = field(default_factory=list)  # dense cache of __call__, rebuilt after each update ...
    _span: int = 17  # ... as far as any call has asked (a batch asks for its whole pass: hundreds of rows)

    def update(self, n: int, seconds: float) -> None:
        if self.frozen:
            return
        self._count += 1
        bare = self.calibrated.get(n)
        if bare:
            self._ratios.append((n > 1, seconds / bare))
            self._level = self._measure_level()
        window = self._passes.get(n)
        if window is None:
            window = self._passes[n] = deque(maxlen=WINDOW)
        window.append((self._count, self._level, seconds))
        when, level = self._swept
        if self._count - when >= SWEEP_EVERY or not level / 1.05 <= self._level <= level * 1.05:
            self._swept = (self._count, self._level)
            for m in self._passes:
                self._refresh(m)
        else:
            self._refresh(n)
        self._curve = []

    def known(self) -> bool:
        return bool(self.calibrated or self._passes)

    def level(self) -> float:
        """Live ÷ calibrated, a low quantile of recent passes (noise only adds): 1 until the loop has made a few."""
        return self._level

    def _measure_level(self) -> float:
        # Passes that verify a draft say it best (they carry the rollback and the rows to check, as every size but 1
        # does), once there are enough of them that a few slow ones cannot set it; all passes stand in until then.
        drafts = [r for draft, r in self._ratios if draft]
        ratios = drafts if len(drafts) >= DRAFT_LEVEL_PASSES else [r for _, r in self._ratios]
        return low_quantile(ratios) if len(ratios) >= MIN_PASSES else 1.0

    def live(self) -> dict[int, tuple[float, int]]:
        """Each size's own figure from recent passes, and how many passes it rests on (at least MIN_PASSES)."""
        return dict(self._own)

    def _refresh(self, n: int) -> None:
        level = self._level
        recent = [s for when, then, s in self._passes[n]
                  if self._count - when < STALE_AFTER and then <= CALMER * level]
        if len(recent) >= MIN_PASSES or (recent and not self.calibrated):
            self._own[n] = (low_quantile(recent), len(recent))
        else:
            self._own.pop(n, None)

    def __call__(self, n: int) -> float:
        if n >= len(self._curve):
            self._span = max(self._span, n)
            self._rebuild(self._span)
        return self._curve[n]

    def _rebuild(self, n_max: int) -> None:
        # one sweep over the sizes in order (a batch's curve runs to hundreds of rows and is rebuilt every pass)
        level = self._level
        seen = {m: s * level for m, s in self.calibrated.items()}
        seen.update({m: s for m, (s, _) in self._own.items()})
        sizes = sorted(seen)
        curve = [0.0] * (n_max + 1)
        i, count = 0, len(sizes)  # sizes[i] is the first measured size >= n
        slope: float | None = None
        for n in range(1, n_max + 1):
            figure = seen.get(n)
            if figure is not None:
                curve[n] = figure
                continue
            while i < count and sizes[i] < n:
                i += 1
            if 0 < i < count:
                below, above = sizes[i - 1], sizes[i]
                curve[n] = seen[below] + (seen[above] - seen[below]) * (n - below) / (above - below)
            elif i and self.wide_slope:
                if slope is None:
                    slope = _top_slope(seen, sizes)
                curve[n] = seen[sizes[-1]] + slope * (n - sizes[-1])
            else:
                ref = sizes[i - 1] if i else sizes[0]
                # outside what was measured: about a fifth of a single pass per extra token (CPU, LM-head bound),
                # and never less than that size's share per token (past the largest size: ``wide_slope``)
                curve[n] = max(seen[ref] + 0.2 * seen.get(1, seen[ref]) * (n - ref), seen[ref] * n / ref)
        self._curve = curve


def _top_slope(seen: dict[int, float], sizes: list[int]) -> float:
    """Seconds per extra row over the upper half of the measured sizes (least squares: one noisy size does not set
    it; live figures of a batch's own wide passes count), at least a twentieth of the smallest size's cost a row."""
    top = [m for m in sizes if m >= sizes[-1] / 2]
    if len(top) < 2:  # a wide size far past the rest (a batch's own pass): the line from the next one down
        top = sizes[-2:]
    floor = seen[sizes[0]] / sizes[0] / 20
    if len(top) < 2:
        return max(floor, 0.2 * seen[sizes[0]])
    mx = sum(top) / len(top)
    my = sum(seen[m] for m in top) / len(top)
    return max(floor, sum((m - mx) * (seen[m] - my) for m in top) / sum((m - mx) ** 2 for m in top))


def auto_parallel(costs: PassCosts, limit: int) -> int:
    """How many sequences to run at once: plain batching's tokens per second, p / cost(p), is what lanes buy; take
    the fewest within PARALLEL_AUTO_SHARE of the best up to ``limit`` (more lanes cost memory and each sequence's
    latency for little)."""
    rate = {p: p / costs(p) for p in range(1, limit + 1)}
    best = max(rate.values())
    return min(p for p, r in rate.items() if r >= PARALLEL_AUTO_SHARE * best)
