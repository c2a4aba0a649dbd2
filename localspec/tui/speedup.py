"""The speedup shown after an answer: an estimate against target-only decoding, never above what the passes allow."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.events import Stats


@dataclass(frozen=True)
class SpeedupEstimate:
    """How much longer target-only decoding would have taken: ``shown`` is ``raw`` capped at what the passes allow."""

    shown: float
    raw: float
    ceiling: float  # generated tokens per target pass
    plain_seconds: float  # the cost of one plain step it was estimated from

    @property
    def capped(self) -> bool:
        return self.raw > self.ceiling


def estimate_speedup(stats: Stats, plain_seconds_per_token: float) -> SpeedupEstimate | None:
    """Generated tokens × the cost of one plain step, over the decode time; None without a plain-step cost.

    A pass costs at least a plain step (it does at least a plain step's work), so an answer can beat target-only
    decoding by at most the tokens each pass gained: a figure above that says the plain-step cost is off (measured
    on a busy machine: 25x at 1.3 tokens per pass was shown), not that the answer was that fast. It is capped there.
    """
    plain = plain_seconds_per_token
    if plain <= 0 or stats.decode_seconds <= 0 or not stats.generated_tokens or not stats.target_passes:
        return None
    raw = stats.generated_tokens * plain / stats.decode_seconds
    ceiling = stats.mean_accepted_length
    return SpeedupEstimate(min(raw, ceiling), raw, ceiling, plain)
