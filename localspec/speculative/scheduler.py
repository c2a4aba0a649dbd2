"""Many sequences, one pass: the batch scheduler.

Each generation keeps its own ``Generator`` (drafters, acceptance statistics, random streams) on a lane of a shared
context. A scheduler step asks every decoding sequence for its plan (the pending token and its draft), adds a chunk
of a waiting prompt, decodes all of it in one pass, and hands each sequence its rows back to settle: verify, accept,
roll back, emit, exactly as ``Generator.step`` does for one. When a sequence ends, the next prompt takes its lane.

What the policy decides here: a draft is priced as what it adds to the whole pass (``DraftPolicy.others``), on the
one cost curve the sequences share, so where a pass of more rows costs a lot more (an H100 past 8 rows) the drafts
shrink to none, and where there are few sequences left they grow again.

A prompt is prefilled in chunks that share passes with the running sequences, so none of them waits for a long
prompt much longer than one pass (``prefill_chunk``, see ``PREFILL_CHUNK``); with no sequence decoding, a chunk
fills the whole batch. A prefix another lane already holds (a shared system prompt, one document asked several
questions) is copied from it (``seq_cp``), and a prompt waits for a lane that is prefilling the prefix they share
instead of computing it a second time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from localspec.drafters.base import Draft
from localspec.errors import STOPPING
from localspec.events import Event, Prefill, Stats
from localspec.faults import ARMED, before_pass
from localspec.passes import Part
from localspec.speculative.batch_size import BatchSize
from localspec.speculative.costs import PassCosts
from localspec.speculative.draft_phase import DraftPhase, DraftWanted
from localspec.speculative.flight import Flight, SharedContext
from localspec.speculative.jobs import Failed, Job, PassStats
from localspec.speculative.loop import Generator, Run, Target
from localspec.speculative.shapes import STEADY, Shapes, Warmup
from localspec.speculative.text import TextStream
from localspec.tokens import common_prefix, held, longest_held

# Prompt tokens a pass takes while other sequences decode. Measured on this 2-core CPU (Gemma 3 270M, a prompt fed
# after 100 cached tokens): 32 tokens prefill at 2.6x the speed of one at a time, 93% of the best any size reaches
# (2.8x from 128), in a pass that costs 12 single ones; 64 tokens would double what each running sequence waits for
# 4% more prefill speed. On the H100 table a pass of 24 rows costs 4.5 single passes, so 32 holds them up less there.
PREFILL_CHUNK = 32


_SPENT = object()  # what next() gives once a job iterator is exhausted (None means "no job yet")
T = TypeVar("T")


class Scheduler:
    """Runs jobs on ``lanes``, ``parallel`` at a time; ``make_generator(lane, job)`` builds a sequence's loop (its
    drafters, and a policy on the shared ``costs``)."""

    def __init__(
        self,
        lanes: SharedContext,
        make_generator: Callable[[Target, Job], Generator],
        costs: PassCosts,
        *,
        parallel: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
        clock: Callable[[], float] = time.perf_counter,
        stats: PassStats | None = None,
        shapes: Shapes | None = None,
        drafts: DraftPhase | None = None,
    ) -> None:
        self.lanes = lanes
        self.drafts = drafts  # the draft model's lanes, where sequences draft with one (draft_phase.py)
        self.make_generator = make_generator
        self.costs = costs
        self.parallel = min(parallel or len(lanes), len(lanes))
        self.prefill_chunk = prefill_chunk
        self.clock = clock
        self.stats = stats if stats is not None else PassStats()
        # the pass sizes this device keeps (a GPU's CUDA graphs): every pass is padded up to the last pass's rows or
        # a kept size where that costs less than the change it saves (speculative/batch_size.py)
        self.shapes = shapes if shapes is not None else Shapes()
        self.warmup = Warmup()
        self.sizes = BatchSize(costs, lanes.max_rows)  # the rows of the last pass, padding included

    def run(
        self, jobs: Iterable[Job | None], cancelled: Callable[[], bool] = lambda: False,
        idle: Callable[[], None] | None = None, flush: Callable[[], None] | None = None,
    ) -> Iterator[tuple[Job, Event]]:
        """Every job's events, as they happen: Prefill, then Steps, then Finished (or one Failed). Jobs are taken
        from ``jobs`` as lanes free up; a None from it means "none yet" (a server's queue), and with nothing running
        the scheduler then calls ``idle`` (which should block until a job may have come). When ``cancelled`` turns
        true, every running job finishes "interrupted" and the jobs not started are left in the iterator.
        ``flush`` is called before each pass's drafts and decode, when every event until that pass ends has been
        yielded: a consumer that gathers events hands them on there, once a pass (the server's Service)."""
        pending = iter(jobs)
        flights: list[Flight | None] = [None] * self.parallel
        more = True
        while True:
            if more and not cancelled():
                more = yield from self._admit(flights, pending)
            if cancelled():
                for f in flights:
                    if f is not None:
                        f.run.reason = f.run.reason or "interrupted"
                        yield self._ended(f)
                return
            for i, f in enumerate(flights):
                if f is not None and f.job.stop is not None and self._guard(f, f.job.stop):
                    f.run.reason = "interrupted"
                    yield self._ended(f)
                    flights[i] = None
            if not any(flights):
                if not more:
                    return
                if idle is not None:
                    idle()
                continue
            yield from self._pass(flights, flush)
            for i, f in enumerate(flights):
                if f is not None and (f.run.reason or f.error):
                    yield self._ended(f)
                    flights[i] = None

    def _guard(self, f: Flight, step: Callable[[], T]) -> T | None:
        """``step()``, one of ``f``'s own: an exception there ends ``f`` alone (docs/architecture.md, "Requests that
        cannot hurt each other"); None once ``f`` has failed."""
        if f.error is not None:
            return None
        try:
            return step()
        except (*STOPPING, DraftWanted):  # stopping, or a plan waiting for the draft phase: not a failure
            raise
        except BaseException as e:
            f.error = Failed.of(e)
            return None

    def _ended(self, f: Flight) -> tuple[Job, Event | Failed]:
        """``f``'s last event: Finished, or Failed with its lane (and draft lane) emptied, since a failed step may
        have left rows the sequence never accepted."""
        finished = self._guard(f, lambda: f.generator.end(f.run))
        if f.error is None and finished is not None:
            return f.job, finished
        self.lanes[f.lane].truncate(0)
        if self.drafts is not None:
            self.drafts.lanes[f.lane].truncate(0)
        assert f.error is not None
        return f.job, f.error

    def _admit(self, flights: list[Flight | None], pending: Iterator[Job | None]) -> Iterator[tuple[Job, Event]]:
        """Fill free lanes with the next jobs; False once ``pending`` is spent."""
        while None in flights:
            job = next(pending, _SPENT)
            if job is _SPENT:
                return False
            if job is None:
                return True
            assert isinstance(job, Job)
            problem = self._problem(job)
            if problem is not None:
                yield job, Failed(problem)
                continue
            lane = self._lane_for(job, flights)
            try:
                flights[lane] = self._start(job, lane)
            except STOPPING:
                raise
            except BaseException as e:  # its generator could not be made: the lane stays free
                self.lanes[lane].truncate(0)
                yield job, Failed.of(e)
        return True

    def _lane_for(self, job: Job, flights: list[Flight | None]) -> int:
        """The free lane that already holds the longest start of ``job``'s prompt (a conversation's last turn, kept
        in the cache after it finished), else the first free one."""
        free = [i for i, f in enumerate(flights) if f is None]
        return max(free, key=lambda i: (self._reusable(i, job, job.prompt[:-1]), -i))

    def _reusable(self, lane: int, job: Job, tokens: Sequence[int]) -> int:
        """How much of ``tokens`` ``job`` may take from what ``lane`` holds: nothing across scopes. The scope is
        the lane's own (``scope``, set when a job starts on it), not this scheduler's: a server that builds a new
        scheduler over the same lanes (after a failed pass) must not hand one key's cached prefix to another. A
        lane whose scope is unknown shares nothing."""
        return held(self.lanes[lane], tokens, job.scope)

    def _problem(self, job: Job) -> str | None:
        n, room = len(job.prompt), self.lanes.n_ctx
        if n == 0:
            return "the prompt is empty"
        if n >= room:
            return f"the prompt is {n} tokens but a sequence holds {room}: raise --ctx or shorten the prompt"
        return None

    def _start(self, job: Job, lane: int) -> Flight:
        # what the lane still holds from its last job is reused where the prompts agree (and the scope is the same)
        kept = self._reusable(lane, job, job.prompt[:-1])
        self.lanes.begin(lane, job)
        target = self.lanes[lane]
        target.truncate(kept)  # what another scope left is gone before the lane is marked as this one's
        target.scope = job.scope  # type: ignore[attr-defined]
        if self.drafts is not None:
            self.drafts.claim(lane, job.scope)
        generator = self.make_generator(target, job)
        generator.policy.in_batch = True  # the scheduler keeps the pass's size; the sequence only drafts
        run = Run(list(job.prompt), job.settings, Stats(prompt_tokens=len(job.prompt)),
                  TextStream(generator.vocab, job.settings.stop))
        run.started = self.clock()
        return Flight(job, lane, generator, run, reused=kept, cached_target=run.history[:-1])

    def _pass(self, flights: list[Flight | None], flush: Callable[[], None] | None = None,
              ) -> Iterator[tuple[Job, Event]]:
        """One pass: every decoding sequence's plan, prompt chunks in what room is left; then settle each."""
        live = [f for f in flights if f is not None]
        for f in live:
            if not f.decoding:
                self._share_prefix(f)
                yield from self._prefilled(f)  # a prompt another lane held, or the lane's last job, is cached whole
        live = [f for f in live if f.error is None]
        decoding = [f for f in live if f.decoding]
        if flush is not None:  # nothing more until this pass is decoded: what the consumer gathered goes now
            flush()
        planned: list[Flight] = []
        wanted: list[tuple[Flight, DraftWanted]] = []  # plans that wait for the draft phase
        rows_after = sum(f.last[0] for f in decoding)
        tokens_after = sum(f.last[1] for f in decoding)
        rows_before, tokens_before = 0, 0.0
        shapes = self.shapes
        for f in decoding:
            rows_after -= f.last[0]
            tokens_after -= f.last[1]
            room = self._guard(f, lambda f=f: f.generator.room(f.run))
            if room is None:
                continue  # ended: its budget is spent or its context full (or it failed)
            others = rows_before + rows_after
            room = min(room, self.lanes.max_rows - others - 1)
            policy = f.generator.policy
            policy.others = (others, tokens_before + tokens_after)
            t0 = self.clock()
            f.room = room
            try:
                f.plan = self._guard(f, lambda f=f, room=room: f.generator.plan(f.run.history, room))
            except DraftWanted as w:  # priced as asked until the phase answers (a grammar's forced tokens lead)
                wanted.append((f, w))
                rows = 1 + len(w.history) - len(f.run.history) + w.cap
            else:
                if f.plan is None:
                    continue
                rows = len(f.plan.rows)
            f.draft_seconds = self.clock() - t0
            f.last = (rows, policy.expected if rows > 1 else 1.0)
            rows_before += rows
            tokens_before += f.last[1]
            planned.append(f)
        if wanted:
            rows_before = self._drafted(wanted, planned)
        if shapes.active and planned:
            rows_before = self.sizes.fill(planned, shapes, rows_before)
        parts = [Part(f.lane, f.plan.rows, "ids" if f.generator.wants_ids else "logits") for f in planned
                 if f.plan is not None]
        prefilling = self._prefill_parts(live, rows_before, bool(planned))
        parts += [Part(f.lane, chunk, None) for f, chunk in prefilling]
        if not parts:
            return
        started = self.clock()
        try:
            if ARMED:  # tests only
                before_pass(f.job.prompt for f in [*planned, *(f for f, _ in prefilling)])
            outputs = self.lanes.decode(parts)
        except STOPPING:
            raise
        except BaseException as e:
            self._failed_pass(live, e)
            return
        self.stats.passes += 1
        self.stats.rows += rows_before
        settled = []
        for f, out in zip(planned, outputs, strict=False):
            assert f.plan is not None and out is not None
            plan, f.plan = f.plan, None
            result = self._guard(f, lambda f=f, plan=plan, out=out: f.generator.settle(
                f.run.history, plan, out, f.draft_seconds, started, shared=True))
            if result is not None:
                settled.append((f, result))
        # timed before the events go up: what their consumers do is not the pass's cost; a prompt chunk's tokens
        # cost less than rows with outputs (not on the curve), and with pass shapes only a steady pass is priced
        seconds = self.clock() - started
        self.stats.seconds += seconds
        if prefilling:
            self.stats.prompt_passes += 1
            self.stats.prompt_seconds += seconds
        stage = self.warmup.step((rows_before, sum(len(chunk) for _, chunk in prefilling)))
        if planned and not prefilling and (stage == STEADY or not shapes.active):
            self.costs.update(rows_before, seconds)
        for f, result in settled:
            step = self._guard(f, lambda f=f, result=result: f.generator.advance(f.run, result))
            if step is not None:
                yield f.job, step
        for f, chunk in prefilling:
            self.stats.prefill_tokens += len(chunk)
            yield from self._prefilled(f)

    def _failed_pass(self, live: list[Flight], e: BaseException) -> None:
        """The pass every running sequence shared failed: each of them ends with that error (its own steps' failures
        end it alone, ``_guard``), and no lane's cache is trusted after it, idle ones' included. The scheduler goes
        on with the jobs still to come."""
        failed = Failed.of(e, shared=True)
        for f in live:
            if f.error is None:
                f.error = failed
        self.empty_lanes()

    def empty_lanes(self) -> None:
        """Every lane's cache, and its draft lane's, emptied: after a failed pass none of them can be trusted."""
        for lane in range(len(self.lanes)):
            self.lanes[lane].truncate(0)
            if self.drafts is not None:
                self.drafts.lanes[lane].truncate(0)

    def _drafted(self, wanted: list[tuple[Flight, DraftWanted]], planned: list[Flight]) -> int:
        """The draft phase: every model draft of the pass at once, then those sequences' plans with their drafts.
        Returns the pass's rows."""
        phase, stats = self.drafts, self.stats
        assert phase is not None
        try:
            drafts = phase.draft([w for _, w in wanted])
        except STOPPING:
            raise
        except BaseException:  # a draft is only a guess: these lanes verify none this pass, their draft lanes restart
            for f, _ in wanted:
                phase.lanes[f.lane].truncate(0)
            drafts = [(Draft(), 0.0)] * len(wanted)
        stats.draft_steps += 1
        stats.draft_passes += phase.depth
        stats.draft_deepest = max(stats.draft_deepest, phase.depth)
        for (f, _), (draft, seconds) in zip(wanted, drafts, strict=True):
            t0 = self.clock()
            f.plan = self._guard(f, lambda f=f, draft=draft: f.generator.plan(f.run.history, f.room, draft))
            f.draft_seconds += seconds + self.clock() - t0
            if f.plan is not None:
                f.last = (len(f.plan.rows), f.last[1] if len(f.plan.rows) > 1 else 1.0)
        planned[:] = [f for f in planned if f.error is None]
        return sum(len(f.plan.rows) for f in planned if f.plan is not None)

    def _prefill_parts(
        self, live: list[Flight], rows: int, decoding: bool
    ) -> list[tuple[Flight, Sequence[int]]]:
        """Prompt chunks for this pass: copy what another lane holds, wait for a lane prefilling a shared prefix,
        and compute the rest in chunks (small while others decode, else the whole batch)."""
        budget = self.lanes.n_batch - rows
        if decoding:
            budget = min(budget, self.prefill_chunk)
        out: list[tuple[Flight, Sequence[int]]] = []
        waiting = [f for f in live if not f.decoding]
        for n, f in enumerate(waiting):
            target = f.cached_target
            have = len(self.lanes[f.lane].tokens)
            # an earlier prompt still computing a prefix this one shares: wait for it, then copy it
            if any(g.job.scope == f.job.scope
                   and common_prefix(g.cached_target, target) > max(have, len(self.lanes[g.lane].tokens))
                   for g in waiting[:n]):
                continue
            take = min(budget, len(target) - have)
            if take > 0:
                out.append((f, target[have : have + take]))
                budget -= take
        return out

    def _share_prefix(self, f: Flight) -> None:
        """Copy the longest start of ``f``'s prompt that another lane holds, running or idle (what a finished
        conversation left), if it is more than ``f``'s own lane holds."""
        lane = self.lanes[f.lane]
        best, source = longest_held(self.lanes, f.lane, f.cached_target, f.job.scope, self.parallel)
        if source >= 0:
            self.stats.shared_prefix_tokens += best - len(lane.tokens)
            f.reused = best
            self.lanes.share(source, f.lane, best)

    def _prefilled(self, f: Flight) -> Iterator[tuple[Job, Event]]:
        """Once its prompt is cached, a flight starts decoding (its last prompt token goes into its first pass)."""
        lane = self.lanes[f.lane]
        target = f.cached_target
        if len(lane.tokens) < len(target):
            return
        f.decoding = True
        f.run.stats.prefill_seconds = self.clock() - f.run.started
        self._guard(f, lambda: f.generator.begin(f.run))
        if f.error is not None:
            return
        yield f.job, Prefill(len(f.run.history), len(f.run.history) - f.reused, f.run.stats.prefill_seconds)

