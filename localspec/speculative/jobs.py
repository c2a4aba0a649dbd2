"""What the scheduler runs and reports, as plain data: a job (one prompt, its limits, sampling and scope), a job that
could not run, and the totals of the passes it shared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.errors import UserError
from localspec.settings import GenerationSettings, SamplingSettings, SpeculationSettings


@dataclass(slots=True)
class Job:
    """One prompt to generate from, with its own limits and sampling; ``key``: the caller's (e.g. a request id).
    ``speculation``: its own drafter and draft length, else the runtime's. ``stop``: true once nobody wants the rest
    (a client that went away); the job then finishes "interrupted" before the next pass and frees its lane."""

    prompt: list[int]
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    key: object = None
    speculation: SpeculationSettings | None = None
    stop: Callable[[], bool] | None = None
    # whose text it is (localspec/history): drafts come from earlier requests of the same scope only, and a prompt's
    # cached prefix is reused only from a lane that last ran the same scope (else one client could time another's
    # prompt by how fast its own prefill runs)
    scope: str = "local"
    # its grammar's matcher, compiled at admission with the model's tokenizer (structured/grammars.py): the pass loop
    # copies it, and compiles nothing
    matcher: object = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A job that could not run or went wrong (its own fault, ``status`` 400: a prompt the context cannot hold, a
    grammar llguidance refuses; else 500: a failure of its own steps, or of the pass it shared); the batch goes on."""

    message: str
    status: int = 400

    @classmethod
    def of(cls, error: BaseException, shared: bool = False) -> Failed:
        """``error`` as one line that names its cause: a UserError is the request's own (400), anything else a
        failure of the server (500); ``shared``: it was the pass every running job shared that failed."""
        if isinstance(error, UserError):
            return cls(str(error))
        where = "the shared pass failed" if shared else "generation failed"
        return cls(" ".join(f"{where}: {type(error).__name__}: {error}".split())[:500], 500)


@dataclass(slots=True)
class PassStats:
    """What the scheduler's passes did, for a job's totals."""

    passes: int = 0
    rows: int = 0  # decode rows (pending tokens and drafts), over all passes
    prefill_tokens: int = 0
    shared_prefix_tokens: int = 0  # prompt tokens copied from another lane instead of computed
    seconds: float = 0.0  # the passes' own time (decoding and settling), over all passes
    # passes that carried a prompt chunk, and their time: drafts do not shorten those (docs/performance.md, "the
    # ceiling of drafts in a batch")
    prompt_passes: int = 0
    prompt_seconds: float = 0.0
    # a draft model's phase (draft_phase.py): the steps it drafted in, its decodes over them, the most in one step
    draft_steps: int = 0
    draft_passes: int = 0
    draft_deepest: int = 0
