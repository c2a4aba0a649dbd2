"""The events a generation emits, consumed alike by the CLI, --json, the TUI and bench.

One :class:`Step` per target pass. The text of a generation is the concatenation, in order, of each step's
``accepted`` tokens and its ``target`` token, plus the :class:`Finished` event's ``tail``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, overload

# the kinds of drafts copied from earlier requests (drafters/ngram.py: "cache/3", "cache/follow", ...): the policy
# carries their trust across a job, and the stats count them apart
CACHE_KIND = "cache/"
# the kinds of drafts copied from a request's prediction (drafters/prediction.py): learned per generation, counted apart
PREDICTION_KIND = "prediction/"

Source = Literal["draft", "target"]


@dataclass(frozen=True, slots=True)
class Token:
    """A generated token: its id, the text it released (UTF-8 safe, stop-string safe), where it came from."""

    id: int
    text: str
    source: Source


class Drafted(Sequence[Token]):
    """Draft tokens a pass verified and turned down (``Step.rejected``, each of ``Step.rejected_branches``): their ids
    now, their tokens (text decoded) when something first reads them. Only the TUI shows rejected drafts, and most
    drafting passes have some: decoding them in the loop made every face pay for what one of them reads. Their count
    (``len``) needs no text. ``piece`` is the model's (Vocab.piece): read them on the thread that runs the model,
    while it is open, as the TUI's engine does when a step arrives (``Step.decode_rejected``)."""

    __slots__ = ("ids", "_piece", "_tokens")

    def __init__(self, ids: Sequence[int], piece: Callable[[int], bytes]) -> None:
        self.ids = ids
        self._piece: Callable[[int], bytes] | None = piece
        self._tokens: tuple[Token, ...] | None = None

    def tokens(self) -> tuple[Token, ...]:
        """The tokens, decoded once (as the loop decoded them before: each piece alone, invalid UTF-8 replaced)."""
        if self._tokens is None:
            piece = self._piece
            assert piece is not None
            self._tokens = tuple(Token(t, piece(t).decode("utf-8", "replace"), "draft") for t in self.ids)
            self._piece = None  # a step that was read no longer holds on to the model's vocabulary
        return self._tokens

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> Token: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Token, ...]: ...
    def __getitem__(self, i: int | slice) -> Token | tuple[Token, ...]:
        return self.tokens()[i]

    def __iter__(self) -> Iterator[Token]:
        return iter(self.tokens())

    def __eq__(self, other: object) -> bool:  # equal to the tuple of the same tokens, as Step's fields were
        if isinstance(other, Drafted | tuple):
            return self.tokens() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.tokens())

    def __repr__(self) -> str:
        return repr(self.tokens())


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
    rejected: Sequence[Token]  # a Drafted from the loop: its text is decoded when read
    target: Token | None
    drafter: str
    k: int
    draft_seconds: float
    verify_seconds: float
    rejected_branches: tuple[Sequence[Token], ...] = ()
    branches: int = 1
    kind: str = ""  # what the draft rested on ("ngram/3", "cache/follow", ...)
    forced: int = 0  # of the draft, the leading tokens a grammar forced (structured output)

    @property
    def emitted(self) -> tuple[Token, ...]:
        return self.accepted + ((self.target,) if self.target is not None else ())

    def decode_rejected(self) -> None:
        """Decode the rejected drafts' text now (``Drafted``), on the thread that runs the model: for a consumer that
        reads them later on a thread of its own (the TUI's)."""
        for run in (self.rejected, *self.rejected_branches):
            if isinstance(run, Drafted):
                run.tokens()


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
    # of ``drafted`` / ``accepted``: the tokens drafted from the request's prediction (drafters/prediction.py)
    prediction_drafted: int = 0
    prediction_accepted: int = 0
    # OpenAI's usage of a prediction: its tokens that appear in the answer, in order, and the rest (tokens.in_order);
    # what the answer is, not what was drafted: the same under --drafter none
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
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
        n_accepted = len(step.accepted)
        n_drafted = n_accepted + len(step.rejected)
        self.drafted += n_drafted + sum(len(run) for run in step.rejected_branches)
        self.accepted += n_accepted
        # what earlier answers, or the prediction, drafted: after any tokens a grammar forced
        if step.kind.startswith(CACHE_KIND):
            self.cache_drafted += n_drafted - step.forced
            self.cache_accepted += max(0, n_accepted - step.forced)
        elif step.kind.startswith(PREDICTION_KIND):
            self.prediction_drafted += n_drafted - step.forced
            self.prediction_accepted += max(0, n_accepted - step.forced)
        if step.forced:
            self.forced_drafted += step.forced
            self.forced_accepted += min(step.forced, len(step.accepted))
        if step.branches > 1:
            self.tree_passes += 1
            self.branches += step.branches
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        if not step.k:
            self.plain_passes += 1
            self.plain_seconds += step.verify_seconds
        while len(self.accepted_by_position) < n_drafted:
            self.accepted_by_position.append([0, 0])
        for i in range(n_drafted):
            self.accepted_by_position[i][1] += 1
            if i < len(step.accepted):
                self.accepted_by_position[i][0] += 1

    def prediction_usage(self) -> dict[str, int]:
        """OpenAI's usage of a prediction (``completion_tokens_details``); what was drafted from it is apart."""
        return {"accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens}

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
