"""The events a generation emits, consumed alike by the CLI, --json, the TUI and bench.

One :class:`Step` per target pass. The text of a generation is the concatenation, in order, of each step's
``accepted`` tokens and its ``target`` token, plus the :class:`Finished` event's ``tail``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

# the kinds of drafts copied from earlier requests (drafters/ngram.py: "cache/3", "cache/follow", ...): the policy
# carries their trust across a job, and the stats count them apart
CACHE_KIND = "cache/"

Source = Literal["draft", "target"]


@dataclass(frozen=True, slots=True)
class Token:
    """A generated token: its id, the text it released (UTF-8 safe, stop-string safe), where it came from."""

    id: int
    text: str
    source: Source


@dataclass(frozen=True, slots=True)
class Prefill:
    """The prompt (or the new part of a conversation) went into the target's context."""

    prompt_tokens: int
    new_tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Step:
    """One target pass: verified draft tokens, rejected ones, and the token the target produced itself.

    ``target`` is None when generation ended inside the accepted draft (end-of-generation, stop string,
    token limit). A pass that verified a token tree (``branches`` > 1) took ``accepted`` from the branch that won;
    ``rejected`` is the rest of that branch, ``rejected_branches`` the other branches' own tokens. ``k``: the draft
    tokens the pass verified (a tree's nodes).
    """

    accepted: tuple[Token, ...]
    rejected: tuple[Token, ...]
    target: Token | None
    drafter: str
    k: int
    draft_seconds: float
    verify_seconds: float
    rejected_branches: tuple[tuple[Token, ...], ...] = ()
    branches: int = 1
    kind: str = ""  # what the draft rested on ("ngram/3", "cache/follow", ...)
    forced: int = 0  # of the draft, the leading tokens a grammar forced (structured output)

    @property
    def emitted(self) -> tuple[Token, ...]:
        return self.accepted + ((self.target,) if self.target is not None else ())


@dataclass(slots=True)
class Stats:
    """Counters in the vocabulary llama.cpp users know (drafted, accepted, accept %, mean accepted length)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # accepted_by_position[i] = [accepted, drafted] for draft position i (0-based; a tree's: of the winning branch)
    accepted_by_position: list[list[int]] = field(default_factory=list)
    tree_passes: int = 0  # passes that verified a token tree (more than one branch)
    branches: int = 0  # branches those passes verified
    # of ``drafted`` / ``accepted``: the tokens drafted from earlier requests (localspec/history)
    cache_drafted: int = 0
    cache_accepted: int = 0
    # of ``drafted`` / ``accepted``: the tokens a grammar forced (structured output), and the grammar's host time
    forced_drafted: int = 0
    forced_accepted: int = 0
    grammar_seconds: float = 0.0
    # passes that verified no draft (one row, as every pass of target-only decoding), and their seconds: what a
    # target-only step costs in this very answer (tui/speedup.py)
    plain_passes: int = 0
    plain_seconds: float = 0.0
    stop_reason: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens gained per target pass: what a pass of the big model buys (1.0 = plain decoding)."""
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    def add_step(self, step: Step) -> None:
        self.target_passes += 1
        self.generated_tokens += len(step.emitted)
        self.drafted += len(step.accepted) + len(step.rejected) + sum(len(run) for run in step.rejected_branches)
        self.accepted += len(step.accepted)
        if step.kind.startswith(CACHE_KIND):  # what earlier answers drafted: after any tokens a grammar forced
            self.cache_drafted += len(step.accepted) + len(step.rejected) - step.forced
            self.cache_accepted += max(0, len(step.accepted) - step.forced)
        if step.forced:
            self.forced_drafted += step.forced
            self.forced_accepted += min(step.forced, len(step.accepted))
        if step.branches > 1:
            self.tree_passes += 1
            self.branches += step.branches
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        n_drafted = len(step.accepted) + len(step.rejected)
        if not step.k:
            self.plain_passes += 1
            self.plain_seconds += step.verify_seconds
        while len(self.accepted_by_position) < n_drafted:
            self.accepted_by_position.append([0, 0])
        for i in range(n_drafted):
            self.accepted_by_position[i][1] += 1
            if i < len(step.accepted):
                self.accepted_by_position[i][0] += 1

    def to_dict(self) -> dict[str, object]:
        rates = ("tokens_per_second", "acceptance_rate", "mean_accepted_length")
        return {**asdict(self), **{name: getattr(self, name) for name in rates}}


@dataclass(frozen=True, slots=True)
class Finished:
    """Generation ended. ``reason``: eog | length | stop | interrupted | context_full | dead_end (a grammar allowed
    no token: the answer is what it had)."""

    reason: str
    stats: Stats
    tail: str = ""


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know that did not stop generation (e.g. speculation switched off)."""

    message: str


Event = Prefill | Step | Notice | Finished
