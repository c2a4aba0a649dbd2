"""One finished benchmark run, and where it first differs from target-only: plain data shared by the runner, the
lossless check (compare.py) and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Largest batch-vs-one-at-a-time difference of a top-5 logit measured on Gemma 3 270M Q4_K_M, 2 threads
# (docs/architecture.md, "Numerics": median ~0.15, up to ~1.1). Two candidates closer than this can swap places between
# the two paths. The default only: a bench measures its device's own margin (speculative/noise.py) and classifies with
# that.
NEAR_TIE_MARGIN = 1.1


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a run first differs from the baseline run of the same prompt.

    ``unit`` is "token" (``position`` indexes generated tokens) or "char" (anchors, compared by text, since the
    high-level API streams text, not token ids). A token of None means that side ended there. ``gap`` is
    |logit(baseline token) − logit(run's token)| at that position, None where it was not measured; ``near_tie``
    is gap ≤ ``margin`` (the device's measured noise), None where unknown. ``path``: how the gap was measured,
    "prefill" (prompt + prefix scored in one pass) or "decode" (re-measured as target-only decoded it, 1 row a
    pass, where the prefill's gap was beyond the margin).
    """

    position: int
    baseline_token: int | None = None
    token: int | None = None
    unit: Literal["token", "char"] = "token"
    gap: float | None = None
    near_tie: bool | None = None
    margin: float = NEAR_TIE_MARGIN
    path: str = "prefill"

    def describe(self) -> str:
        where = f"{self.unit} {self.position}"
        if self.near_tie is None:
            return f"differs at {where} (unclassified)"
        kind = "near-tie" if self.near_tie else "NOT a near-tie"
        how = "" if self.path == "prefill" else ", measured as target-only decoded it"
        return f"differs at {where}: {kind} (logit gap {self.gap:.2f}, margin {self.margin:.2f}{how})"


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
    # under a JSON schema (None elsewhere): the tokens its grammar forced, drafted and accepted, and whether the
    # answer parses and validates under the schema (an answer cut off by max_tokens does not)
    forced_drafted: int | None = None
    forced_accepted: int | None = None
    valid: bool | None = None

    @property
    def tree_share(self) -> float | None:
        """The share of target passes that verified a token tree (None: not known)."""
        if self.tree_passes is None or not self.target_passes:
            return None
        return self.tree_passes / self.target_passes

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.compared else None
