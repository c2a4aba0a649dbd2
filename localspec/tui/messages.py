"""Messages the generation worker posts to the app.

Steps themselves do not travel as messages: the worker appends them to a queue that a ~30 Hz timer drains (see
``ChatApp``), so the message queue carries only the few events that change the app's state.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from localspec.events import Finished, Prefill


@dataclass
class RuntimeReady(Message):
    """The model (and the first drafter) opened; the app can take questions."""

    model_name: str
    template_source: str
    drafter: str
    notices: list[str]


@dataclass
class RuntimeLoading(Message):
    """What opening the model is doing that takes a while (measuring this machine's pass costs, once)."""

    text: str


@dataclass
class RuntimeFailed(Message):
    """The model could not be opened; ``error`` is the one-line reason shown to the user."""

    error: str


@dataclass
class DrafterSwitched(Message):
    """The worker switched drafter before an answer (``error`` set: it could not, and kept ``drafter``)."""

    drafter: str
    error: str | None = None


@dataclass
class Prefilled(Message):
    """The conversation went into the target's context; ``prefill.new_tokens`` were not cached already.

    ``decode_started`` is the worker's ``perf_counter`` when decoding began: live tok/s is timed from it, on the
    worker's clock, because the message may be handled after the first steps were already queued.
    """

    prefill: Prefill
    decode_started: float


@dataclass
class AnswerFinished(Message):
    """Generation ended. ``plain_seconds_per_token`` is the measured cost of one target-only step (0: unknown)."""

    finished: Finished
    drafter: str
    plain_seconds_per_token: float


@dataclass
class AnswerFailed(Message):
    """Generation could not run; ``context_full`` marks the one failure the user can fix from the app."""

    error: str
    context_full: bool = False
