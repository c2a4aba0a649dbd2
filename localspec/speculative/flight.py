"""What the batch scheduler flies on and keeps per sequence: the lanes that share passes (``SharedContext``) and a job
on one of them (``Flight``), from its prefill to its end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from localspec.passes import Outputs, Part
from localspec.speculative.jobs import Failed, Job
from localspec.speculative.loop import Generator, Plan, Run, Target


class SharedContext(Protocol):
    """Sequences (lanes) that share passes: engine.lanes.Lanes, a toy in tests, priced lanes in a replay."""

    n_ctx: int  # tokens one lane may hold
    n_batch: int  # tokens one pass may hold
    max_rows: int  # outputs one pass may have

    def __len__(self) -> int: ...
    def __getitem__(self, lane: int) -> Target: ...
    def begin(self, lane: int, job: Job) -> None: ...  # ``job`` starts on ``lane``
    def decode(self, parts: Sequence[Part]) -> list[Outputs | None]: ...
    def share(self, src: int, dst: int, n: int) -> None: ...


@dataclass(slots=True)
class Flight:
    """A job on a lane: prefilling until its prompt (all but the pending last token) is cached, then decoding."""

    job: Job
    lane: int
    generator: Generator
    run: Run
    decoding: bool = False
    plan: Plan | None = None
    reused: int = 0  # prompt tokens found in the cache (the lane's own, or copied from another lane), not computed
    draft_seconds: float = 0.0
    room: int = 0  # draft tokens its last plan could have held
    last: tuple[int, float] = (1, 1.0)  # rows of its last plan, and the tokens they were expected to emit
    error: Failed | None = None  # one of its own steps failed: it ends with this, and no other flight is touched
    # what its prefill caches: the prompt but its pending last token, taken once (read every pass while it prefills)
    cached_target: list[int] = field(default_factory=list)
