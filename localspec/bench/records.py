"""One finished benchmark run: plain data shared by the runner, the lossless check and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localspec.bench.compare import Divergence


@dataclass(slots=True)
class RunRecord:
    """One (prompt, drafter, repeat) generation. Acceptance figures are None where nothing was drafted by us
    (target-only runs, anchors); ``anchor`` runs come from llama-cpp-python's high-level API and carry text only.
    ``tree_passes``: the target passes that verified a token tree (several candidate branches), ``branches`` the
    branches they verified; None, like the pass count, where nothing was drafted or the record predates trees."""

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
    target_passes: int | None = None
    tree_passes: int | None = None
    branches: int | None = None

    @property
    def tree_share(self) -> float | None:
        """The share of target passes that verified a token tree (None: not known)."""
        if self.tree_passes is None or not self.target_passes:
            return None
        return self.tree_passes / self.target_passes

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.compared else None
