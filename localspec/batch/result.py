"""What one request of a batch produced: its text and stats, or the error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.events import Stats


@dataclass(slots=True)
class Result:
    """``finish_reason``: stop (end of generation or a stop string) | length | context_full | interrupted |
    tool_calls | dead_end (a grammar allowed nothing more) | error.
    ``error`` is set (and ``text`` empty) when the request failed before generating, e.g. a prompt too long."""

    id: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # the generated token ids
    finish_reason: str = "stop"
    stats: Stats = field(default_factory=Stats)
    error: str | None = None
    index: int = 0  # the request's position in the job
    # the tools the answer called (OpenAI's tool_calls: id, type, function {name, arguments as a JSON string});
    # finish_reason "tool_calls", and ``text`` the text before them
    tool_calls: list[dict] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
