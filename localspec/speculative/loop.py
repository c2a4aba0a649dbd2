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

from localspec.drafters.base import Draft, Drafter
from localspec.engine.context import common_prefix
from localspec.errors import ContextFullError, RollbackUnsupported
from localspec.events import Event, Finished, Notice, Prefill, Stats, Step, Token
from localspec.sampling import PositionalDraws
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.text import TextStream
from localspec.speculative.verify import Verdict, verify_greedy, verify_sampled


class Target(Protocol):
    """What the loop needs from the target model's context (engine.Context, or a toy model in tests)."""

    tokens: list[int]
    n_ctx: int

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray: ...
    def decode_argmax(self, tokens: Sequence[int]) -> list[int]: ...
    def feed(self, tokens: Sequence[int]) -> None: ...
    def truncate(self, n_keep: int) -> None: ...


class TokenInfo(Protocol):
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class StepResult:
    draft: Draft
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
        self.drafters = list(drafters)
        self.sampling = sampling
        self.policy = policy or DraftPolicy()
        self.clock = clock
        self.notices: list[str] = []

    def step(self, history: list[int], room: int) -> StepResult:
        """One target pass. ``history`` is the accepted tokens; at most ``room`` draft tokens are proposed."""
        t0 = self.clock()
        draft = self._propose(history, room)
        t1 = self.clock()
        # verify: one batch, [pending] + draft, scored at every position (greedy: token ids only, no logits)
        n_cached = len(self.target.tokens)
        batch = [history[-1], *draft.tokens]
        if self.sampling.greedy:
            verdict = verify_greedy(draft.tokens, self.target.decode_argmax(batch))
        else:
            logits = self.target.decode(batch, all_logits=True)
            position = len(history)  # where the first token of this pass lands
            verdict = verify_sampled(draft.tokens, draft.dists, logits, self.sampling,
                                     lambda i: self.draws.at(position + i))
        # roll back: keep the pending token and the accepted draft prefix, drop the rejected tail
        self._roll_back(n_cached + 1 + verdict.n_accepted)
        t2 = self.clock()
        emitted = [*draft.tokens[: verdict.n_accepted], verdict.token]
        self.policy.observe(draft, verdict.n_accepted, t1 - t0, t2 - t1, emitted)
        return StepResult(draft, verdict, emitted, t1 - t0, t2 - t1)

    def _propose(self, history: list[int], room: int) -> Draft:
        """The policy caps each drafter, the drafter proposes, the policy trims: the first draft left wins."""
        for drafter in self.drafters:
            cap = self.policy.cap(drafter, room)
            if cap:
                draft = self.policy.trim(drafter.propose(history, cap), drafter)
                if draft.tokens:
                    return draft
        return Draft()

    def _roll_back(self, n_keep: int) -> None:
        try:
            self.target.truncate(n_keep)
        except RollbackUnsupported:
            # the model's memory cannot drop a suffix (recurrent/hybrid): rebuild it once, then decode plainly
            kept = self.target.tokens[:n_keep]
            self.target.truncate(0)
            self.target.feed(kept)
            self.drafters = []
            self.notices.append("this model cannot roll back its cache: speculation is off, decoding plainly")

    def generate(
        self,
        prompt: Sequence[int],
        settings: GenerationSettings,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Iterator[Event]:
        """Stream events for one generation. The cache is reused from the previous call where prompts agree."""
        history = list(prompt)
        self.draws = PositionalDraws(self.sampling.seed)  # per generation: unseeded runs differ
        stats = Stats(prompt_tokens=len(history))
        yield self._prefill(history, stats)
        for drafter in self.drafters:
            drafter.begin(history)
        self.policy.restart()
        text = TextStream(self.vocab, settings.stop)
        reason = "length"
        start = self.clock()
        try:
            while stats.generated_tokens < settings.max_tokens:
                if cancelled():
                    reason = "interrupted"
                    break
                room_ctx = self.target.n_ctx - len(history)
                if room_ctx < 0:
                    reason = "context_full"
                    break
                room = min(settings.max_tokens - stats.generated_tokens - 1, room_ctx)
                result = self.step(history, room)
                event, ended = self._emit(result, text, settings.max_tokens - stats.generated_tokens)
                history.extend(t.id for t in event.emitted)
                for drafter in self.drafters:
                    drafter.accept(history, len(event.accepted))
                stats.add_step(event)
                yield event
                while self.notices:
                    yield Notice(self.notices.pop(0))
                if ended:
                    reason = ended
                    break
        except KeyboardInterrupt:
            reason = "interrupted"
        # keep the invariant for the next call: the cache holds history[:-1]
        self.target.truncate(len(history) - 1)
        stats.stop_reason = reason
        stats.decode_seconds = self.clock() - start
        yield Finished(reason, stats, "" if reason == "stop" else text.flush())

    def _prefill(self, history: list[int], stats: Stats) -> Prefill:
        if len(history) >= self.target.n_ctx:
            raise ContextFullError(
                f"the prompt is {len(history)} tokens but the context holds {self.target.n_ctx}: "
                "raise --ctx or shorten the prompt"
            )
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
        rejected = tuple(
            Token(t, self.vocab.piece(t).decode("utf-8", "replace"), "draft") for t in result.draft.tokens[n:]
        )
        target = out[-1] if out and out[-1].source == "target" else None
        accepted = tuple(out[:-1] if target is not None else out)
        step = Step(
            accepted, rejected, target, result.draft.drafter or "none", len(result.draft),
            result.draft_seconds, result.verify_seconds,
        )
        return step, ended
