"""Pass shapes: which pass sizes a device keeps cheap, what changing size costs, and which size to keep.

On a GPU, llama.cpp replays a CUDA graph only while the pass keeps its shape (ggml-cuda.cu,
``ggml_backend_cuda_graph_compute``; its graphs are kept in a map keyed by the graph's first node, whose address is
the same for every pass of a context, so all sizes share one entry): a pass of another
size runs without a graph and resets the warm-up, the next pass of that size captures one, and only the pass after
that replays it. Measured on an H100: 1 row 1.10 ms steady, 1.65 ms without a graph. So a loop whose draft length
changes every pass never gets a graph, and what a size costs depends on the sizes before it.

Three parts, each small:
- ``Warmup`` follows the sizes a context decodes and says where a pass stands (after a change, capture, steady);
  the replay prices passes with it, and live passes tell the cost curve only their steady cost.
- ``Shapes`` is a device's sizes (learned from the calibration: none on a CPU, where a change costs nothing and
  every row costs real time) and the price of changing to each.
- ``Depths`` learns, in hindsight, how many tokens a pass of each draft depth would have made over recent steps, and
  ``choose`` keeps a size until another one's gain over the horizon pays for the change.

A pass padded up to its size verifies the padding like any draft token (the rest of the lookup's proposal, then
filler); the loop rolls back what the target rejects, so the output does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

AFTER_CHANGE, CAPTURE, STEADY = 0, 1, 2  # where a pass stands in its graph's warm-up
# weight of the past in the hindsight estimates (~10 steps), and pseudo-steps at 1 token a pass behind a fresh one (a
# depth has to earn its rows): replayed on the H100 table (tools/gpu_replay.py), 0.9 and 4 put adaptive within 1% of
# the best fixed k on the built-in suite and on the held-out prompts alike, every category within 2%; 0.95-0.97 and
# 2 followed a copy too slowly (a ramp of 1, 2, 4, 8 rows) or left a size on a dip
_DECAY = 0.9
_PRIOR_STEPS = 4.0
_HORIZON = 96  # tokens over which a change of size must pay for itself (at most what the generation has left)
_KNEE = 1.25  # a size whose next size costs this much more is kept too (an H100's 8 → 9: small-batch kernels)
_PENALTY_FLOOR = 0.05  # a change costing less than this share of a single pass is no change: a CPU


@dataclass(slots=True)
class Warmup:
    """The sizes a context decoded: the last one and how many passes in a row had it."""

    size: Hashable = 0
    run: int = 0

    def step(self, n: Hashable) -> int:
        """Record a pass of shape ``n`` (its rows, or rows and prompt tokens); AFTER_CHANGE, CAPTURE or STEADY."""
        self.run = self.run + 1 if n == self.size else 0
        self.size = n
        return min(self.run, STEADY)


@dataclass(frozen=True, slots=True)
class Shapes:
    """A device's pass sizes, ascending (empty: any size, as on a CPU), the seconds a change to each costs beyond its
    steady passes (the pass without a graph plus the pass that captures one), and what one pass of a size costs
    beyond its steady pass when it runs without a graph (a one-off pass: no capture follows)."""

    sizes: tuple[int, ...] = ()
    penalty: Mapping[int, float] = field(default_factory=dict)
    unsteady: Mapping[int, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.sizes)

    def size_for(self, rows: int) -> int:
        """The smallest kept size that holds ``rows`` (past the largest: ``rows`` itself)."""
        return next((s for s in self.sizes if s >= rows), rows)

    def change_cost(self, size: int) -> float:
        """What changing to ``size`` costs: measured, else as the nearest measured size below it (``learn`` fills
        in every kept size, so the policy's choice is a lookup)."""
        return _nearest(self.penalty, size)

    def one_pass_cost(self, size: int) -> float:
        """What one pass of ``size`` without a graph costs beyond a steady one (measured, else as the nearest below)."""
        return _nearest(self.unsteady, size)

    @classmethod
    def learn(cls, steady: Mapping[int, float], after_change: Mapping[int, float], capture: Mapping[int, float],
              n_max: int) -> Shapes:
        """The sizes worth keeping on a device whose passes were timed steady, right after a change, and while
        capturing: none where a change costs (almost) nothing. Kept: 1, powers of two from 4, and each size whose
        next one costs ``_KNEE`` times more (a kernel's limit). (2 is left out: a size between that the policy would
        stop at on its way up, paying one change more for a few passes.)"""
        penalty = {n: max(0.0, after_change[n] - steady[n]) + max(0.0, capture.get(n, steady[n]) - steady[n])
                   for n in steady if n in after_change}
        single = steady.get(1, 0.0)
        if not penalty or single <= 0 or max(penalty.values()) < _PENALTY_FLOOR * single:
            return cls()
        sizes = {1, *(1 << i for i in range(2, n_max.bit_length()) if 1 << i <= n_max)}
        sizes |= {n for n in steady if n + 1 in steady and steady[n + 1] >= _KNEE * steady[n]}
        kept = tuple(sorted(s for s in sizes if s <= n_max))
        measured = cls(kept, penalty)
        unsteady = {n: max(0.0, after_change[n] - steady[n]) for n in steady if n in after_change}
        return cls(kept, {**{s: measured.change_cost(s) for s in kept}, **penalty}, unsteady)


def _nearest(table: Mapping[int, float], size: int) -> float:
    """``table`` at ``size``, else at the nearest size below it it has (the smallest it has, below them all)."""
    if size in table:
        return table[size]
    known = sorted(table)
    if not known:
        return 0.0
    below = [s for s in known if s <= size]
    return table[below[-1] if below else known[0]]


def pad(tokens: Sequence[int], proposal: Sequence[int], history: Sequence[int], depth: int) -> list[int]:
    """``tokens`` (the draft) filled up to ``depth``: first with the rest of the untrimmed ``proposal`` it was cut
    from, then by repeating the history's last tokens (a guess as good as any: verified and rolled back if wrong)."""
    out = list(tokens)
    if len(out) < depth and proposal[: len(out)] == out:
        out += proposal[len(out) : depth]
    filler = list(history[-8:]) or [0]
    while len(out) < depth:
        out.append(filler[len(out) % len(filler)])
    return out[:depth]


@dataclass(slots=True)
class Depths:
    """Tokens a pass would have made at each of the draft ``depths`` the policy can choose (its kept sizes less the
    pending row) over recent steps, learned in hindsight from every proposal (trimmed or not) and every step without
    one: a pass at depth d makes 1 + min(matched, d) tokens.

    A proposal counts from the step it was made (``record``), and each of its tokens as soon as the target emits it
    (``matched``), not once the whole proposal is settled: a long copy verified one token a pass would otherwise be
    heard of only 16 passes late, and the policy would sit at one row all that while. Only the depths asked about are
    kept: each emitted token costs a few additions, not one per possible depth."""

    depths: tuple[int, ...]
    tokens: dict[int, float] = field(default_factory=dict)
    weight: float = _PRIOR_STEPS
    steps: int = 0  # steps recorded so far (a proposal's age)

    def __post_init__(self) -> None:
        self.tokens = dict.fromkeys(self.depths, _PRIOR_STEPS)

    def track(self, depth: int) -> None:
        """Also learn ``depth`` from now on (a pinned k's, asked for after the policy was made): as if every step so
        far had made one token there."""
        if depth not in self.tokens:
            self.tokens[depth] = self.weight

    def record(self) -> None:
        """A step: its pass's own token at every depth."""
        tokens = self.tokens
        for d in tokens:
            tokens[d] = tokens[d] * _DECAY + 1.0
        self.weight = self.weight * _DECAY + 1.0
        self.steps += 1

    def matched(self, j: int, age: int) -> None:
        """Token ``j`` of a proposal recorded ``age`` steps ago matched: every depth past j would have made it (the
        decay since has already shrunk that step's share)."""
        weight = _DECAY**age
        tokens = self.tokens
        for d in tokens:
            if d > j:
                tokens[d] += weight

    def expected(self, depth: int) -> float:
        """Tokens a pass at ``depth`` (one of ``depths``) makes, on average over recent steps."""
        return self.tokens[depth] / self.weight


def choose(
    current: int, sizes: Sequence[int], rate: Callable[[int], tuple[float, float]], change_cost: Callable[[int], float],
    horizon: int,
) -> int:
    """The size to decode at: ``current`` unless another one's time saved over ``horizon`` tokens pays for changing
    to it (none yet: the fastest). ``rate(size)`` → (tokens a pass makes, seconds it costs steady); the horizon is
    at most _HORIZON tokens (what the estimates are good for)."""
    per_token = {size: seconds / tokens for size in sizes for tokens, seconds in [rate(size)]}
    if current not in per_token:
        return min(per_token, key=lambda size: (per_token[size], size))
    horizon = max(1, min(horizon, _HORIZON))
    best, best_saving = current, 0.0
    # a change must pay for the way back too: the estimates are noisy, and a size left on a dip is often wanted
    # again a few passes later (two changes, four passes without a graph)
    back = change_cost(current)
    for size, there in per_token.items():
        saving = (per_token[current] - there) * horizon - change_cost(size) - back
        if size != current and saving > best_saving:
            best, best_saving = size, saving
    return best


def stretch(depth: int, expected: Sequence[float], seconds: Callable[[int], float], shapes: Shapes,
            made: float) -> int:
    """The draft depth for one pass: the kept ``depth``, or a longer one where the tokens a draft is ``expected`` to
    have accepted at each depth (from its kind's record) pay for a pass of that size without a graph and the change
    back to the kept size, at what the kept size pays for a token (``made``: the tokens its passes make). A copy that
    has been right for 10 tokens is worth one unsteady pass of 11 rows, not three steady passes of 4."""
    steady = seconds(depth + 1)
    per_token = steady / max(1.0, made)
    back = shapes.change_cost(depth + 1)
    best, best_gain = depth, 0.0
    for d in range(depth + 1, len(expected)):
        extra = seconds(d + 1) + shapes.one_pass_cost(d + 1) + back - steady
        gain = (expected[d] - expected[depth]) * per_token - extra
        if gain > best_gain:
            best, best_gain = d, gain
    return best
