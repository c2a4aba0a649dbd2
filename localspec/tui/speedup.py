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
    # where that cost came from: "answer" (its own one-row passes), "calibration", "nothing drafted" (1.00x)
    source: str = "calibration"

    @property
    def capped(self) -> bool:
        return self.raw > self.ceiling


# one-row passes of the answer itself that price a target-only step (fewer: the calibration's plain step)
OWN_PASSES = 3


def estimate_speedup(stats: Stats, plain_seconds_per_token: float) -> SpeedupEstimate | None:
    """Generated tokens × the cost of one plain step, over the decode time; None without a plain-step cost.

    The plain step is this answer's own one-row passes where it made a few (the calibration's figure was measured
    apart from the chat's own work, and an answer that drafted nothing showed 0.91x); an answer that drafted
    nothing ran target-only's very passes: 1.00x.
    A pass costs at least a plain step (it does at least a plain step's work), so an answer can beat target-only
    decoding by at most the tokens each pass gained: a figure above that says the plain-step cost is off (measured
    on a busy machine: 25x at 1.3 tokens per pass was shown), not that the answer was that fast. It is capped there.
    """
    if stats.decode_seconds <= 0 or not stats.generated_tokens or not stats.target_passes:
        return None
    if not stats.drafted:
        return SpeedupEstimate(1.0, 1.0, stats.mean_accepted_length, plain_seconds_per_token, "nothing drafted")
    own = stats.plain_passes >= OWN_PASSES
    plain = stats.plain_seconds / stats.plain_passes if own else plain_seconds_per_token
    if plain <= 0:
        return None
    raw = stats.generated_tokens * plain / stats.decode_seconds
    ceiling = stats.mean_accepted_length
    return SpeedupEstimate(min(raw, ceiling), raw, ceiling, plain, "answer" if own else "calibration")
