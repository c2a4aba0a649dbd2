"""What a generation would cost on another device: replay the drafting policy on a measured cost table.

Greedy output does not depend on the drafter (up to near-tie numerics), so the tokens generated on this machine can
be drafted again offline, with the policy calibrated on another device's pass costs, and every pass priced there.
That judges a draft-length policy for an H100 on a CPU-only machine, and answers a user's "what would this buy on
that machine".

Each pass is priced by the table (bench/cost_table.py): by its size, by where it stands in a GPU's graph warm-up
(the target's ``Warmup``), by how many sequences share it, plus the host time the table was fitted with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from localspec.bench.compare import BASELINE, baselines
from localspec.bench.cost_table import CostTable, load_cost_table, shipped_tables
from localspec.bench.records import RunRecord
from localspec.bench.runner import PREDICTED, split_variant
from localspec.drafters.base import Draft
from localspec.errors import UserError
from localspec.events import Finished, Stats
from localspec.opening import lookup_drafters
from localspec.passes import Part
from localspec.settings import MODEL_FREE_DRAFTERS, GenerationSettings, SamplingSettings
from localspec.speculative.costs import PassCosts
from localspec.speculative.jobs import Job
from localspec.speculative.loop import Generator, Target
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.scheduler import Scheduler
from localspec.speculative.shapes import AFTER_CHANGE, CAPTURE, STEADY, Warmup

__all__ = ["CostTable", "load_cost_table", "replay", "replay_batch", "replay_oracle", "shipped_tables"]

REPLAYABLE = MODEL_FREE_DRAFTERS  # auto is replayed without its draft model
ORACLE = "oracle"


class _Clock:
    """The time a replay has priced so far; the loop reads it as it would read the wall clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


_EOG = -2  # what the known target answers after the last token of a generation that ended on end-of-generation


class _KnownTarget:
    """A target whose greedy answers are known (the generation being replayed); each pass advances the clock by
    what the table says it costs. Prefill is free: a replay prices decoding only."""

    def __init__(self, sequence: Sequence[int], table: CostTable, clock: _Clock, *, eog: bool) -> None:
        self.sequence, self.table, self.clock = [*sequence, *([_EOG] if eog else [])], table, clock
        self.tokens: list[int] = []
        self.scope: str | None = None  # whose text the scheduler ran on it (Job.scope)
        self.n_ctx = len(self.sequence) + 1
        self._tree: list[int] = []
        self.warmup = Warmup()  # a pass costs by the sizes before it (a GPU's graphs)

    def decode_argmax(self, tokens: Sequence[int]) -> list[int]:
        self.clock.now += self.table.step(len(tokens), self.warmup.step(len(tokens)))
        return self.answer(tokens)

    def answer(self, tokens: Sequence[int]) -> list[int]:
        """Cache ``tokens``; what the target emits after each (past the end of the replayed text, nothing matches)."""
        start = len(self.tokens)
        self.tokens += tokens
        return [self.sequence[i + 1] if i + 1 < len(self.sequence) else -1 for i in range(start, len(self.tokens))]

    def decode_tree_argmax(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
        """A tree pass costs a pass over all its nodes; only rows on the replayed text's path get its answer."""
        start = len(self.tokens)
        self.clock.now += self.table.step(len(tokens), self.warmup.step(len(tokens)))
        self._tree = list(tokens)
        depth, on_path, out = [0] * len(tokens), [False] * len(tokens), []
        for i, token in enumerate(tokens):
            if i:
                depth[i] = depth[parents[i]] + 1
            here = start + depth[i]
            on_path[i] = (i == 0 or on_path[parents[i]]) and here < len(self.sequence) and self.sequence[here] == token
            out.append(self.sequence[here + 1] if on_path[i] and here + 1 < len(self.sequence) else -1)
        return out

    def keep_path(self, rows: Sequence[int]) -> None:
        self.tokens += [self._tree[r] for r in rows]

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        raise NotImplementedError("replays are greedy: a sampled run's tokens depend on its drafts")

    decode_tree = decode

    def feed(self, tokens: Sequence[int]) -> None:
        self.tokens += tokens

    def truncate(self, n_keep: int) -> None:
        del self.tokens[n_keep:]


class _NoText:
    """Token text does not matter to a replay."""

    def piece(self, token: int) -> bytes:
        return b""

    def is_eog(self, token: int) -> bool:
        return token == _EOG


def replay(
    drafter: str, prompt: Sequence[int], output: Sequence[int], table: CostTable, *, k: int | None = None,
    k_max: int = 16, eog: bool = False, branches: int = 1, policy: DraftPolicy | None = None, shapes: bool = True,
) -> Stats:
    """Generate ``output`` again through the speculation loop, with ``drafter`` and the policy (adaptive, or fixed
    ``k``; token trees of up to ``branches`` candidates) calibrated on the table's bare passes, against a target
    that knows the answers and prices each pass. ``eog``: the generation ended on end-of-generation, whose pass
    counts too. ``policy``: the one to replay instead (``k``, ``k_max`` and ``branches`` are then its own): one
    calibrated elsewhere (on a busy machine, say), or one that has already run, to go on from what it learned.
    ``shapes``: keep the pass sizes the table's device keeps (as localspec does there); False: as before it did."""
    drafters = lookup_drafters(drafter)
    if drafters is None:
        raise UserError(f"drafter {drafter!r} cannot be replayed: only {', '.join(REPLAYABLE)} draft without a model")
    if policy is None:
        policy = DraftPolicy(k_max=k_max, fixed=k, branches=branches,
                             shapes=table.shapes(k_max + 1) if shapes else None)
        policy.calibrate(table.calibration(k_max + 1, steady=shapes))
    clock = _Clock()
    target = _KnownTarget([*prompt, *output], table, clock, eog=eog)
    generator = Generator(target, _NoText(), drafters, SamplingSettings(), policy, clock)
    budget = len(output) + (1 if eog else 0)
    finished = [e for e in generator.generate(prompt, GenerationSettings(max_tokens=budget))
                if isinstance(e, Finished)][-1]
    return finished.stats


@dataclass(frozen=True, slots=True)
class Known:
    """A generation to replay: its prompt, the tokens it produced, whether it ended on end-of-generation."""

    prompt: list[int]
    output: list[int]
    eog: bool = False


@dataclass(frozen=True, slots=True)
class BatchReplay:
    """A batch job priced on a table: its decoding seconds and what its passes held."""

    seconds: float
    generated_tokens: int
    passes: int
    rows: int
    drafted: int
    accepted: int

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


class _KnownLanes:
    """Lanes whose greedy answers are known (each job's generation); a pass costs what the table says for all its
    rows, and its prompt chunks what the table's ``prompt_share`` says (a batch's wall clock holds its prompts)."""

    def __init__(self, table: CostTable, clock: _Clock, known: Sequence[Known], n_lanes: int, max_rows: int) -> None:
        self.table, self.clock, self.known = table, clock, known
        self.lanes = [_KnownTarget([], table, clock, eog=False) for _ in range(n_lanes)]
        self.n_ctx = max(len(k.prompt) + len(k.output) for k in known) + 2
        self.n_batch, self.max_rows = 1 << 30, max_rows
        self.warmup = Warmup()

    def __len__(self) -> int:
        return len(self.lanes)

    def __getitem__(self, lane: int) -> _KnownTarget:
        return self.lanes[lane]

    def begin(self, lane: int, job: Job) -> None:
        known = self.known[int(job.key)]  # type: ignore[call-overload]
        self.lanes[lane] = _KnownTarget([*known.prompt, *known.output], self.table, self.clock, eog=known.eog)

    def decode(self, parts: Sequence[Part]) -> list[list[int] | None]:
        rows = sum(len(p.tokens) for p in parts if p.want)
        prompt = sum(len(p.tokens) for p in parts if not p.want)
        if rows:
            stage = self.warmup.step((rows, prompt))
            self.clock.now += self.table.step(rows, stage, sum(1 for p in parts if p.want))
        self.clock.now += self.table.prompt(rows, prompt)
        return [self.lanes[p.lane].answer(p.tokens) if p.want else self.lanes[p.lane].feed(p.tokens) for p in parts]

    def share(self, src: int, dst: int, n: int) -> None:
        self.lanes[dst].tokens = self.lanes[src].tokens[:n]


def replay_batch(
    drafter: str, known: Sequence[Known], table: CostTable, parallel: int, *, k: int | None = None, k_max: int = 16,
    shapes: bool = True, runs: Callable[[Known], list[int]] | None = None,
) -> BatchReplay:
    """Generate every ``known`` output again as one batch job, ``parallel`` sequences at a time, each drafting with
    ``drafter`` (adaptive, or fixed ``k``) on a policy calibrated on the table's bare passes; every pass priced on the
    table for all the rows it holds. ``oracle``: drafts that are always right, as far as the oracle lookup copies
    (a batch's ceiling); ``runs``: how far the oracle's draft at each output position runs instead (another
    clairvoyant drafter's)."""
    if drafter != ORACLE and lookup_drafters(drafter) is None:
        raise UserError(f"drafter {drafter!r} cannot be replayed: only {', '.join(REPLAYABLE)} draft without a model")
    clock = _Clock()
    kept = table.shapes(parallel * (k_max + 1)) if shapes else None
    # as BatchRuntime calibrates
    costs = PassCosts(table.calibration(k_max + 1, steady=shapes), wide_slope=kept is not None and kept.active)
    lanes = _KnownLanes(table, clock, known, parallel, parallel * (k_max + 1))

    def make(target: Target, job: Job) -> Generator:
        sampling = job.sampling
        mine = known[int(job.key)]  # type: ignore[call-overload]
        drafters = [_Oracle(mine, k_max, runs and runs(mine))] if drafter == ORACLE else lookup_drafters(drafter) or []
        return Generator(target, _NoText(), drafters, sampling,
                         DraftPolicy(k_max=k_max, fixed=k, costs=costs, shapes=kept), clock)

    scheduler = Scheduler(lanes, make, costs, parallel=parallel, clock=clock, shapes=kept)
    jobs = [Job(list(g.prompt), GenerationSettings(max_tokens=len(g.output) + (1 if g.eog else 0)), key=i)
            for i, g in enumerate(known)]
    stats = [e.stats for _, e in scheduler.run(jobs) if isinstance(e, Finished)]
    return BatchReplay(clock.now, sum(s.generated_tokens for s in stats), scheduler.stats.passes,
                       scheduler.stats.rows, sum(s.drafted for s in stats), sum(s.accepted for s in stats))


class _Oracle:
    """A lookup drafter that knows the generation: it proposes as far as the oracle lookup would copy correctly."""

    name = ORACLE
    lookup = True

    def __init__(self, known: Known, k_max: int, runs: list[int] | None = None) -> None:
        self.sequence, self.start = [*known.prompt, *known.output], len(known.prompt)
        self.runs = oracle_runs(known.prompt, known.output, k_max) if runs is None else runs

    def begin(self, history: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        here = len(history)
        pos = here - self.start
        n = min(self.runs[pos], cap) if 0 <= pos < len(self.runs) else 0
        return Draft(self.sequence[here : here + n], None, self.name, self.name)

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def replay_oracle(
    prompt: Sequence[int], output: Sequence[int], table: CostTable, k_max: int = 16, *, eog: bool = False,
    min_suffix: int = 0,
) -> Stats:
    """The ceiling for any lookup drafter: each step may copy from the earlier occurrence that continues correctly the
    longest (at most ``k_max`` tokens, never past what has been generated); ``min_suffix``: only from occurrences
    whose ``min_suffix`` tokens before agree with the history's last (what a lookup keyed on that suffix could
    find). It knows how far each copy runs, and lays out its passes for the least time on the table: where a change
    of size costs (a GPU's graphs), it weighs the change as pass shapes do."""
    runs = oracle_runs(prompt, output, k_max, min_suffix)
    seconds, passes, accepted = fastest_schedule(runs, table, k_max + 1, eog=eog)
    return Stats(generated_tokens=len(output), decode_seconds=seconds, target_passes=passes, drafted=accepted,
                 accepted=accepted)


def oracle_runs(prompt: Sequence[int], output: Sequence[int], k_max: int = 16, min_suffix: int = 0) -> list[int]:
    """For each output position, how far the best earlier occurrence continues it correctly (at most ``k_max``, never
    past what has been generated, never past the output's end); ``min_suffix``: as ``replay_oracle``."""
    seq, start = [*prompt, *output], len(prompt)
    runs = []
    for pos in range(len(output)):
        here, best = start + pos, 0
        suffix = seq[here - min_suffix : here]
        for j in range(min_suffix, here):
            if min_suffix and seq[j - min_suffix : j] != suffix:
                continue
            n = 0
            while n < k_max and j + n < here and here + n < len(seq) and seq[j + n] == seq[here + n]:
                n += 1
            best = max(best, n)
        runs.append(min(best, len(output) - pos - 1))
    return runs


def fastest_schedule(runs: Sequence[int], table: CostTable, n_max: int, *, eog: bool) -> tuple[float, int, int]:
    """(seconds, passes, draft tokens) of the fastest way through a generation where a pass at position i with n rows
    makes 1 + min(runs[i], n - 1) tokens: a shortest path over (position, the last pass's size, its warm-up)."""
    stages = (AFTER_CHANGE, CAPTURE, STEADY) if table.after_change else (STEADY,)
    price = {(n, stage): table.step(n, stage) for n in range(1, n_max + 1) for stage in stages}
    # position -> (size, stage) -> (seconds, passes, draft tokens); a CPU's table has one stage: every pass steady
    best: list[dict[tuple[int, int], tuple[float, int, int]]] = [{} for _ in range(len(runs) + 1)]
    best[0][(0, stages[-1] if len(stages) == 1 else AFTER_CHANGE)] = (0.0, 0, 0)
    for pos, run in enumerate(runs):
        for (size, stage), (seconds, passes, drafted) in best[pos].items():
            for n in range(1, n_max + 1):  # rows past the copy are padding (to keep a size steady)
                nxt = _next_stage(stages, size, stage, n)
                copied = min(run, n - 1)
                got = (seconds + price[(n, nxt)], passes + 1, drafted + copied)
                here = best[pos + copied + 1]
                if got[0] < here.get((n, nxt), (float("inf"),))[0]:
                    here[(n, nxt)] = got
    ends = []
    for (size, stage), (seconds, passes, drafted) in best[-1].items():
        if eog:  # the pass that produced end-of-generation (padded too, where that is cheaper)
            seconds = seconds + min(price[(n, _next_stage(stages, size, stage, n))] for n in range(1, n_max + 1))
            passes += 1
        ends.append((seconds, passes, drafted))
    return min(ends)


def _next_stage(stages: tuple[int, ...], size: int, stage: int, n: int) -> int:
    """Where a pass of n rows stands in the graph's warm-up after one of ``size`` at ``stage`` (as ``Warmup``)."""
    if len(stages) == 1:
        return stage
    return min(stage + 1, STEADY) if n == size else AFTER_CHANGE


def replay_records(
    records: Sequence[RunRecord], prompts: Mapping[str, Sequence[int]], table: CostTable, *, fixed_k: int | None,
    with_draft_model: bool, k_max: int = 16, branches: int = 1,
) -> tuple[list[RunRecord], list[str]]:
    """Every run priced on ``table`` (its tokens drafted again by the same drafter and policy, with trees of up to
    ``branches`` candidates), plus an ``oracle`` (a chain's ceiling)
    run per baseline; and the entries that could not be replayed (anchors, and drafters that need a model: ``auto``
    too when it had a draft model to fall back on). A run that parted from target-only at a near-tie is priced over
    target-only's text: which way a near-tie went is this machine's numerics, not the drafter's doing nor the
    device's, and drafters priced over other texts are compared on luck as much as on drafting."""
    out: list[RunRecord] = []
    skipped: list[str] = []
    base = baselines(records)
    for r in records:
        name, k, b = (r.drafter, None, None) if r.anchor else split_variant(r.drafter)
        # a run given its prediction drafted from what the replay does not have
        if r.anchor or r.drafter.endswith(PREDICTED) or name not in REPLAYABLE \
                or (name == "auto" and with_draft_model) or r.prompt_id not in prompts:
            skipped.append(r.drafter)
            continue
        text = base[r.prompt_id] if r.divergence is not None and r.divergence.near_tie else r
        prompt, eog = prompts[r.prompt_id], text.stop_reason == "eog"
        got = replay(name, prompt, text.tokens, table, k=fixed_k if k is None else k, k_max=k_max, eog=eog,
                     branches=branches if b is None else b)
        out.append(_priced(r, got, drafted=name != BASELINE))
        if name == BASELINE:
            oracle = replay_oracle(prompt, r.tokens, table, k_max, eog=eog)
            out.append(_priced(replace(r, drafter=ORACLE, compared=False, divergence=None), oracle, drafted=True))
    return out, list(dict.fromkeys(skipped))


def _priced(r: RunRecord, got: Stats, *, drafted: bool) -> RunRecord:
    """``r`` with the timing, acceptance and tree counts of its replay (the same fields a live run reports)."""
    return replace(
        r, decode_seconds=got.decode_seconds, tokens_per_second=got.tokens_per_second,
        acceptance_rate=got.acceptance_rate if drafted else None,
        mean_accepted_length=got.mean_accepted_length if drafted else None,
        target_passes=got.target_passes if drafted else None, tree_passes=got.tree_passes if drafted else None,
        branches=got.branches if drafted else None,
    )
