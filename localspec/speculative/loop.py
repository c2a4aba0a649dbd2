"""The speculation loop: propose → verify → accept → roll back → emit, one target pass per step.

Invariant between steps: the target's cache holds ``history[:-1]``; the last accepted token is "pending" and goes
into the next pass first, followed by the draft, so one batched pass both extends the cache and scores every
draft position. Stats, stop conditions and streaming live in ``generate``; ``step`` is the algorithm.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.drafters.base import Draft, Drafter, Verdict
from localspec.drafters.prediction import PredictionDrafter
from localspec.errors import ContextFullError, RollbackUnsupported, UserError
from localspec.events import Drafted, Event, Finished, Notice, Prefill, Stats, Step, Token
from localspec.passes import Outputs, reads_ids
from localspec.sampling import PositionalDraws, shape
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.text import TextStream
from localspec.speculative.tree import TokenTree
from localspec.speculative.verify import verify_greedy, verify_sampled
from localspec.structured.constraint import Constraint, closing_room
from localspec.structured.grammars import Grammars
from localspec.tokens import common_prefix, in_order

# the draft rows of every pass of a constrained generation on a device with pass shapes (8 rows: the most that
# llama.cpp's small-batch CUDA kernels take)
CONSTRAINED_DEPTH = 7


class Target(Protocol):
    """What the loop needs from the target model's context (engine.Context, or a toy model in tests)."""

    tokens: list[int]
    n_ctx: int

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray: ...
    def decode_argmax(self, tokens: Sequence[int]) -> list[int]: ...
    def feed(self, tokens: Sequence[int]) -> None: ...
    def truncate(self, n_keep: int) -> None: ...

    # token trees: ``parents[i]`` is the batch row token i follows (-1: the cache), parents first; after the pass,
    # ``keep_path`` keeps the rows of one root-to-node path and drops the rest
    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray: ...
    def decode_tree_argmax(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]: ...
    def keep_path(self, rows: Sequence[int]) -> None: ...


class TokenInfo(Protocol):
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sequence wants verified in a pass: ``rows`` = [the pending token, *the draft's nodes]; ``parents``
    None for a chain (each row follows the one before), else the row each row follows (-1: the cache)."""

    draft: Draft
    tree: TokenTree
    rows: list[int]
    parents: list[int] | None


@dataclass(slots=True)
class Run:
    """One generation in progress: what it has accepted so far (prompt included), its limits, stats and text."""

    history: list[int]
    settings: GenerationSettings
    stats: Stats
    text: TextStream
    reason: str = ""  # why it ended; "" while it runs
    started: float = 0.0


@dataclass(frozen=True, slots=True)
class StepResult:
    draft: Draft
    tree: TokenTree  # the draft's candidates as verified (a chain for one)
    verdict: Verdict
    emitted: list[int]  # the accepted draft tokens, then the target's own
    draft_seconds: float
    verify_seconds: float


class Generator:
    """Generates from a target model, with or without drafters, emitting one Step event per target pass.

    ``drafters`` are asked in turn each step (``auto``: n-gram lookup, then the draft model); the first with a
    draft the policy keeps is verified. None: plain decoding. ``clock`` times the steps (a replay passes its own).
    """

    def __init__(
        self,
        target: Target,
        vocab: TokenInfo,
        drafters: Sequence[Drafter],
        sampling: SamplingSettings,
        policy: DraftPolicy | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.vocab = vocab
        self.drafters = drafters
        self.sampling = sampling
        self.policy = policy or DraftPolicy()
        self.clock = clock
        self.notices: list[str] = []
        # called with a finished generation's tokens (prompt and output): the runtime keeps them for later drafts
        self.on_end: Callable[[list[int]], None] | None = None
        # the model's grammars (structured output), and the running generation's constraint, if it has one
        self.grammars: Grammars | None = None
        self.constraint: Constraint | None = None
        self.compiled: object | None = None  # the job's matcher as its admission compiled it (Grammars.compile)

    @property
    def drafters(self) -> list[Drafter]:
        return self._drafters

    @drafters.setter
    def drafters(self, drafters: Sequence[Drafter]) -> None:
        self._drafters = drafters if isinstance(drafters, list) else list(drafters)
        # the running generation's drafters: a request's prediction first where it has one (``begin``), then these
        self._cascade: Sequence[Drafter] = self._drafters

    def step(self, history: list[int], room: int) -> StepResult:
        """One target pass. ``history`` is the accepted tokens; at most ``room`` draft tokens are proposed.

        plan (propose: the rows to verify) → one decode → settle (verify, accept, roll back, learn); a scheduler that
        shares a pass among sequences calls plan and settle itself, around a decode of everyone's rows."""
        t0 = self.clock()
        plan = self.plan(history, room)
        t1 = self.clock()
        return self.settle(history, plan, self._decode(plan), t1 - t0, t1)

    def plan(self, history: list[int], room: int, drafted: Draft | None = None) -> Plan:
        """Propose: ask the drafters, and lay the draft out as the rows one pass verifies. ``drafted``: a batch's
        draft phase answered the model drafter (speculative/draft_phase.py), so the cascade is not asked again."""
        # under a grammar on a device with pass shapes, one size throughout: forced tokens come and go, and each
        # change of size costs a CUDA graph's warm-up (docs/structured.md). One sequence only: in a batch the
        # scheduler sizes the pass for every lane at once
        policy = self.policy
        depth = None
        if self.constraint is not None and policy.keeps_size:
            room = depth = min(room, CONSTRAINED_DEPTH)
        draft = self._propose(history, room, drafted)
        if self.drafters:  # a device with pass shapes verifies a draft padded up to the size it keeps
            draft = policy.pad(draft, history, room, depth)
        return self._laid_out(draft, history)

    def widen(self, plan: Plan, history: list[int], depth: int, room: int) -> Plan:
        """``plan`` with its draft padded to ``depth`` tokens, at most ``room``: a batch keeps its pass's size
        (scheduler.py). A sequence without drafters is never padded: it verifies nothing."""
        if not self.drafters:
            return plan
        draft = self.policy.pad(plan.draft, history, room, depth)
        return plan if draft is plan.draft else self._laid_out(draft, history)

    @staticmethod
    def _laid_out(draft: Draft, history: list[int]) -> Plan:
        tree = TokenTree.of(draft.candidates)
        # a chain verifies [pending, *draft] in order; a tree's nodes follow their parents (-1: the cache)
        parents = None if tree.branches == 1 else [-1, *(parent + 1 for parent in tree.parents)]
        return Plan(draft, tree, [history[-1], *tree.tokens], parents)

    @property
    def wants_ids(self) -> bool:
        """Whether a pass's rows may come back as token ids: greedy, and no grammar that may need a row's logits."""
        return reads_ids(self.sampling.greedy, self.constraint is not None)

    def _decode(self, plan: Plan) -> Outputs:
        """The pass: token ids when greedy (no logits copied), else logits, for every row."""
        greedy, target = self.wants_ids, self.target
        if plan.parents is None:
            return target.decode_argmax(plan.rows) if greedy else target.decode(plan.rows, all_logits=True)
        decode = target.decode_tree_argmax if greedy else target.decode_tree
        return decode(plan.rows, plan.parents)

    def settle(
        self, history: list[int], plan: Plan, outputs: Outputs, draft_seconds: float, started: float,
        *, shared: bool = False,
    ) -> StepResult:
        """Verify the pass's ``outputs`` for ``plan``, accept, roll back and tell the policy; ``started``: the clock
        when the pass began. ``shared``: other sequences' rows were in the pass (the scheduler prices it)."""
        verdict = self._verify(len(history), plan, outputs)
        accepted = [plan.tree.tokens[node] for node in verdict.nodes]
        # roll back: keep the pending token and the accepted draft tokens (a chain's prefix, a tree's path)
        rows = None if plan.parents is None else [0, *(node + 1 for node in verdict.nodes)]
        self._roll_back(history, accepted, rows)
        verify_seconds = self.clock() - started
        emitted = [*accepted, verdict.token]
        self.policy.observe(plan.draft, verdict.n_accepted, draft_seconds, verify_seconds, emitted, len(plan.tree),
                           priced=not shared)
        return StepResult(plan.draft, plan.tree, verdict, emitted, draft_seconds, verify_seconds)

    def _verify(self, position: int, plan: Plan, outputs: Outputs) -> Verdict:
        """Greedy: keep the draft while it matches the target's argmax. Sampled: rejection sampling for a chain; a
        tree (one-hot candidates) is walked with the target's token drawn from the position's own random stream,
        exactly as a chain's one-hot draft is verified (verify.py). ``position``: where the pass's first row lands."""
        tree, greedy = plan.tree, self.sampling.greedy
        if self.constraint is not None:  # a chain: drafts under a grammar are never trees (_propose)
            return self.constraint.verify(tree.tokens, outputs, self.sampling, lambda i: self.draws.at(position + i),
                                          position)
        if plan.parents is None:
            if greedy:
                return verify_greedy(tree.tokens, outputs)
            return verify_sampled(tree.tokens, plan.draft.dists, outputs, self.sampling,
                                  lambda i: self.draws.at(position + i))
        if greedy:
            path, token = tree.walk(lambda row, depth: outputs[row])
        else:
            path, token = tree.walk(
                lambda row, depth: shape(outputs[row], self.sampling).sample(self.draws.at(position + depth)))
        return Verdict(len(path), token, tuple(path))

    def _propose(self, history: list[int], room: int, drafted: Draft | None = None) -> Draft:
        """The policy caps each drafter, the drafter proposes, the policy trims: the first draft left wins. Under a
        grammar, its forced tokens lead and the drafters continue after them, cut where the grammar forbids."""
        if self.constraint is not None and self.drafters:  # --drafter none drafts nothing, forced tokens included
            # the two together fill at most one pass, as any draft (k_max: the rows a context scores)
            return self.constraint.propose(history, min(room, self.policy.k_max),
                                           lambda h, r: self._after_forced(h, r, len(history), drafted))
        return self._lookup(history, room) if drafted is None else drafted

    def _after_forced(self, history: list[int], room: int, forced_from: int, drafted: Draft | None) -> Draft:
        """The drafters propose after the forced tokens (``history[forced_from:]``): the policy prices their rows as
        what they add to the pass those fill, and scores a lookup from where it begins."""
        if drafted is not None:
            return drafted
        self.policy.follow(history[forced_from:])
        try:
            return self._lookup(history, room, 1)
        finally:
            self.policy.follow(())

    def _lookup(self, history: list[int], room: int, width: int | None = None) -> Draft:
        for drafter in self._cascade:
            cap = self.policy.cap(drafter, room)
            if cap:
                wide = self.policy.width(drafter) if width is None else width
                draft = self.policy.trim(drafter.propose(history, cap, wide), drafter)
                if draft.tokens:
                    return draft
        return Draft()

    def _roll_back(self, history: list[int], accepted: list[int], rows: list[int] | None) -> None:
        """Leave ``history`` and the ``accepted`` draft tokens in the cache: a chain drops its rejected tail, a tree
        keeps the batch ``rows`` of its accepted path."""
        try:
            if rows is None:
                self.target.truncate(len(history) + len(accepted))
            else:
                self.target.keep_path(rows)
        except RollbackUnsupported:
            # the model's memory cannot drop a suffix (recurrent/hybrid): rebuild it once, then decode plainly
            self.target.truncate(0)
            self.target.feed([*history, *accepted])
            self.drafters = []
            self.notices.append("this model cannot roll back its cache: speculation is off, decoding plainly")

    def generate(
        self,
        prompt: Sequence[int],
        settings: GenerationSettings,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[Event]:
        """Stream events for one generation. The cache is reused from the previous call where prompts agree."""
        run = Run(list(prompt), settings, Stats(prompt_tokens=len(prompt)), TextStream(self.vocab, settings.stop))
        yield self._prefill(run.history, run.stats)
        self.begin(run)
        try:
            while not run.reason:
                room = self.room(run)
                if room is None:
                    break
                if cancelled():
                    run.reason = "interrupted"
                    break
                yield self.advance(run, self.step(run.history, room))
                while self.notices:
                    yield Notice(self.notices.pop(0))
        except KeyboardInterrupt:
            run.reason = "interrupted"
        yield self.end(run)

    # -- one generation, a step at a time: generate's parts, which a scheduler drives for many sequences --

    def begin(self, run: Run) -> None:
        """Start ``run`` (its prompt cached up to the last token): fresh random streams, drafters and watch list."""
        self.draws = PositionalDraws(self.sampling.seed)  # per generation: unseeded runs differ
        self.constraint = self._constrain(run)
        # a prediction is drafted from where anything is (--drafter none drafts nothing, a prediction included)
        prediction = run.settings.prediction
        self._cascade = [PredictionDrafter(prediction), *self.drafters] if prediction and self.drafters \
            else self.drafters
        for drafter in self._cascade:
            drafter.begin(run.history)
        self.policy.restart()
        run.started = self.clock()

    def room(self, run: Run) -> int | None:
        """How many draft tokens the next step may propose; None when the run has ended (its reason set)."""
        if run.stats.generated_tokens >= run.settings.max_tokens:
            run.reason = run.reason or "length"
            return None
        room_ctx = self.target.n_ctx - len(run.history)
        if room_ctx < 0:
            run.reason = "context_full"
            return None
        return min(run.settings.max_tokens - run.stats.generated_tokens - 1, room_ctx)

    def advance(self, run: Run, result: StepResult) -> Step:
        """Emit a settled step's tokens into ``run``: history, drafters, stats, and its end if one was reached."""
        event, ended = self._emit(result, run.text, run.settings.max_tokens - run.stats.generated_tokens)
        run.history.extend(t.id for t in event.emitted)
        verified = max(1, len(result.draft.candidates))
        for drafter in self._cascade:
            # a grammar's forced tokens led the draft: the drafter's own proposal began after them
            drafter.accept(run.history, max(0, len(event.accepted) - result.draft.forced), verified)
        run.stats.add_step(event)
        if ended:
            run.reason = ended
        constraint = self.constraint
        if constraint is not None:
            run.stats.grammar_seconds = constraint.seconds
            if constraint.dead_end or constraint.failed:
                run.reason = "dead_end"
            elif constraint.done and not run.reason:  # complete: only the end may follow, so end without a pass
                run.reason = "eog"
        return event

    def _constrain(self, run: Run) -> Constraint | None:
        spec = run.settings.constraint
        if spec is None:
            return None
        if self.grammars is None:
            raise UserError("structured output needs the model's vocabulary: this runtime has none")
        constraint = self.grammars.start(spec, self.compiled)
        if spec.name == "tool_calls":  # a call is shut before its tokens run out, not cut (structured/constraint.py)
            max_tokens = run.settings.max_tokens
            constraint.close_at = len(run.history) + max_tokens - closing_room(max_tokens)
        return constraint

    def end(self, run: Run) -> Finished:
        """Close ``run``: the cache keeps the invariant for the next call (it holds history[:-1])."""
        self.target.truncate(len(run.history) - 1)
        reason = run.reason or "length"
        stats = run.stats
        stats.stop_reason = reason
        stats.decode_seconds = self.clock() - run.started
        prediction = run.settings.prediction
        if prediction:  # OpenAI's usage: what of the prediction the answer holds, however it was drafted
            stats.accepted_prediction_tokens = in_order(prediction, run.history[stats.prompt_tokens :])
            stats.rejected_prediction_tokens = len(prediction) - stats.accepted_prediction_tokens
        self._cascade = self.drafters
        if self.on_end is not None and run.stats.generated_tokens:
            self.on_end(run.history)
        return Finished(reason, run.stats, "" if reason == "stop" else run.text.flush())

    def _prefill(self, history: list[int], stats: Stats) -> Prefill:
        if len(history) >= self.target.n_ctx:
            raise ContextFullError.prompt(len(history), self.target.n_ctx)
        t0 = self.clock()
        keep = common_prefix(self.target.tokens, history[:-1])
        self.target.truncate(keep)
        if len(history) - 1 > keep:
            self.target.feed(history[keep:-1])
        stats.prefill_seconds = self.clock() - t0
        return Prefill(len(history), len(history) - 1 - keep, stats.prefill_seconds)

    def _emit(self, result: StepResult, text: TextStream, budget: int) -> tuple[Step, str | None]:
        """Turn a verified step into tokens, stopping at end-of-generation, a stop string or the token budget."""
        n = result.verdict.n_accepted
        out: list[Token] = []
        ended: str | None = None
        for i, token in enumerate(result.emitted):
            if self.vocab.is_eog(token):
                ended = "eog"
                break
            released, hit = text.feed(token)
            out.append(Token(token, released, "draft" if i < n else "target"))
            if hit:
                ended = "stop"
                break
            if len(out) >= budget:
                ended = "length"
                break
        tail, others = result.tree.rejected(result.verdict.nodes)
        if result.draft.filler:  # rejected filler was never a proposal: not "drafted" (a chain: nodes are positions)
            tail = [node for node in tail if node < len(result.draft) - result.draft.filler]
        target = out[-1] if out and out[-1].source == "target" else None
        accepted = tuple(out[:-1] if target is not None else out)
        step = Step(
            accepted, self._drafted(result.tree, tail), target, result.draft.drafter or "none", len(result.tree),
            result.draft_seconds, result.verify_seconds, tuple(self._drafted(result.tree, run) for run in others),
            result.tree.branches, result.draft.kind, result.draft.forced,
        )
        return step, ended

    def _drafted(self, tree: TokenTree, nodes: Sequence[int]) -> Sequence[Token]:
        """Rejected draft tokens: their text is decoded only if something reads it (events.Drafted; the TUI)."""
        if not nodes:
            return ()
        tokens = tree.tokens
        return Drafted([tokens[n] for n in nodes], self.vocab.piece)
