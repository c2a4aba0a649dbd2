"""Draft models in a batch: the scheduler's draft phase (docs/architecture.md, "Draft models in a batch").

A sequence that drafts with a model does not decode it alone. Its drafter (``LaneDrafter``) stops the plan where the
model is asked (``DraftWanted``: the history and the length the policy chose); the scheduler gathers every lane's
request, and ``DraftPhase.draft`` answers them together on the draft model's own lanes, one decode per depth. The
first decode carries each lane's catch-up (what its draft lane has not seen: the last step's accepted tokens and the
target's, or a prompt at a lane's first draft) beside its first draft row, so a step takes as many draft decodes as
its deepest draft. The scheduler then makes those plans again with the drafts as the model's answer
(``Generator.plan(drafted=…)``): the lookups before it in the cascade, which found nothing, are not asked twice.

A draft lane mirrors its target lane: it holds a prefix of the sequence's accepted history, takes a prefix another
draft lane of the same scope holds instead of computing it, and never keeps another scope's cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.drafters.base import Draft
from localspec.passes import Outputs, Part
from localspec.sampling import Distribution, pick
from localspec.settings import SamplingSettings
from localspec.tokens import backlog, common_prefix, longest_held

# a catch-up at least this long (a prompt) first looks for a draft lane of the same scope that holds it already
SHARE_FROM = 16
# the most catch-up tokens a lane decodes in one phase: a longer one (a prompt at its lane's first draft) goes a chunk
# a step, its lane drafting nothing until it is done, as the target's prompts are chunked (scheduler.PREFILL_CHUNK):
# no lane waits on another's draft prefill for much more than a draft decode
CATCH_UP = 32


class DraftLane(Protocol):
    tokens: list[int]
    scope: str | None

    def truncate(self, n_keep: int) -> None: ...


class DraftLanes(Protocol):
    """The draft model's sequences: engine.lanes.Lanes on the draft model, or a toy in tests."""

    n_batch: int
    n_ctx: int  # tokens one lane may hold

    def __len__(self) -> int: ...
    def __getitem__(self, lane: int) -> DraftLane: ...
    def decode(self, parts: Sequence[Part]) -> list[Outputs | None]: ...
    def share(self, src: int, dst: int, n: int) -> None: ...


class DraftWanted(Exception):  # noqa: N818 (a request, not an error: the scheduler answers it)
    """Out of a plan: ``drafter``'s model is asked for up to ``cap`` tokens after ``history``. ``history`` is the
    sequence's own list, not a copy: the draft phase reads it during the pass that raised this, and keeps nothing."""

    def __init__(self, drafter: LaneDrafter, history: list[int], cap: int) -> None:
        super().__init__(drafter.name)
        self.drafter, self.history, self.cap = drafter, history, cap


class LaneDrafter:
    """A sequence's draft model in a batch (the Drafter protocol) on its lane of the draft context; what it proposes
    comes from the scheduler's draft phase."""

    lookup = False

    def __init__(
        self, phase: DraftPhase, lane: int, sampling: SamplingSettings, rng: np.random.Generator, *,
        name: str = "draft", p_min: float = 0.0,
    ) -> None:
        self.phase, self.lane, self.sampling, self.rng = phase, lane, sampling, rng
        self.name, self.p_min = name, p_min
        self._asked: int | None = None  # what its lane held when it was last asked (all of it agreed with the history)

    def begin(self, history: Sequence[int]) -> None:
        lane = self.phase.lanes[self.lane]
        lane.truncate(common_prefix(lane.tokens, history[:-1]))

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        if cap <= 0 or len(history) + cap > self.phase.lanes.n_ctx:  # (a draft model's lanes may be shorter)
            return Draft(drafter=self.name, kind=self.name)
        self._asked = len(self.phase.lanes[self.lane].tokens)
        # the history itself, not a copy (a prompt of thousands of tokens, every pass): the phase only reads it, in
        # the same pass, before the step that extends it is settled. A list keeps common_prefix's block compare
        raise DraftWanted(self, history if isinstance(history, list) else list(history), cap)

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        # the lane holds the history it drafted after, then its drafts: it keeps what agrees with the new history up
        # to its last token (the target's own). Only what it decoded since it was asked can disagree (a rejected
        # draft, or filler the target took where the draft had other tokens)
        lane = self.phase.lanes[self.lane]
        keep = min(len(lane.tokens), len(history) - 1)
        if self._asked is not None:
            keep = next((i for i in range(self._asked, keep) if lane.tokens[i] != history[i]), keep)
            self._asked = None
        lane.truncate(keep)

    def close(self) -> None:
        """Nothing: the draft lanes are the runtime's."""


@dataclass(slots=True)
class _Request:
    wanted: DraftWanted
    tokens: list[int]
    dists: list[Distribution] | None


class DraftPhase:
    """Drafts every lane's request at once on ``lanes``."""

    def __init__(
        self, lanes: DraftLanes, *, name: str = "draft", token_seconds: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.lanes = lanes
        self.name = name  # its drafters' ("draft", "early-exit"): their drafts' kind
        # what a drafted token costs a lane drafting alone (a decode of one row): the policy's first price,
        # corrected by each lane's share of the phases it drafted in
        self.token_seconds = token_seconds
        self.clock = clock
        self.depth = 0  # the last phase's decodes: one per depth of its deepest draft

    def claim(self, lane: int, scope: str) -> None:
        """A job of ``scope`` starts on ``lane``: what another scope left in its draft lane goes first (a prefix
        kept across scopes would let one client time another's prompt)."""
        draft = self.lanes[lane]
        if draft.scope != scope:
            draft.truncate(0)
            draft.scope = scope

    def draft(self, wanted: Sequence[DraftWanted]) -> list[tuple[Draft, float]]:
        """Each request's draft, with its share of the phase's seconds (by the rows it put in: its catch-up and its
        drafted tokens). A lane still catching up a long prompt drafts nothing this time."""
        started = self.clock()
        requests = [_Request(w, [], None if w.drafter.sampling.greedy else []) for w in wanted]
        # every lane's catch-up and first draft row fit one decode
        most = min(CATCH_UP, self.lanes.n_batch // len(wanted) - 1)
        rows: list[int] = []
        parts: list[Part] = []
        going: list[_Request] = []
        for r in requests:
            lane, backlog = r.wanted.drafter.lane, self._backlog(r.wanted)
            rows.append(min(len(backlog), most))
            if len(backlog) > most:
                parts.append(Part(lane, backlog[:most], None))
                continue
            if len(backlog) > 1:
                parts.append(Part(lane, backlog[:-1], None))  # caught up beside the first draft row
            parts.append(Part(lane, backlog[-1:], "logits"))
            going.append(r)
        self.depth = 0
        while parts:
            outputs = [out for out in self.lanes.decode(parts) if out is not None]
            self.depth += 1
            parts, still = [], []
            for r, out in zip(going, outputs, strict=True):
                d = r.wanted.drafter
                picked = pick(np.asarray(out)[-1], d.sampling, d.rng, d.p_min)
                if picked is None:
                    continue
                token, q = picked
                r.tokens.append(token)
                if r.dists is not None and q is not None:
                    r.dists.append(q)
                if len(r.tokens) < r.wanted.cap:  # the last token is never decoded here: the target verifies it
                    parts.append(Part(d.lane, [token], "logits"))
                    still.append(r)
            going = still
        seconds = self.clock() - started
        rows = [n + len(r.tokens) for n, r in zip(rows, requests, strict=True)]
        return [(Draft(r.tokens, r.dists, r.wanted.drafter.name, r.wanted.drafter.name), seconds * n / sum(rows))
                for r, n in zip(requests, rows, strict=True)]

    def _backlog(self, wanted: DraftWanted) -> Sequence[int]:
        """What the request's draft lane must decode to draft after its history (at least the last token)."""
        lane_id, history = wanted.drafter.lane, wanted.history
        rest = backlog(self.lanes[lane_id], history)
        if len(rest) >= SHARE_FROM:
            self._share(lane_id, history[:-1])
            rest = history[len(self.lanes[lane_id].tokens) :]
        return rest

    def _share(self, lane_id: int, prefix: list[int]) -> None:
        """Copy the longest start of ``prefix`` that another draft lane of the same scope holds, where it is more
        than the lane's own."""
        lane = self.lanes[lane_id]
        best, source = longest_held(self.lanes, lane_id, prefix, lane.scope)
        if source >= 0:
            scope = lane.scope
            self.lanes.share(source, lane_id, best)
            self.lanes[lane_id].scope = scope
