"""One finished benchmark run: plain data shared by the runner, the lossless check and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localspec.bench.compare import Divergence


@dataclass(slots=True)
class RunRecord:
    """One (prompt, drafter, repeat) generation. Acceptance figures are None where nothing was drafted by us
    (target-only runs, anchors); ``anchor`` runs come from llama-cpp-python's high-level API and carry text only."""

    prompt_id: str
    category: str
    drafter: str
    repeat: int
    tokens: list[int]
    text: str
    generated_tokens: int
    decode_seconds: float
    tokens_per_second: float
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    stop_reason: str = ""
    anchor: bool = False
    # set by compare.annotate: whether a baseline run existed, and where this run first differs from it
    compared: bool = False
    divergence: Divergence | None = field(default=None)

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.compared else None
