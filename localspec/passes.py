"""What a pass over several sequences is made of, as plain data: each lane's share of the rows (``Part``) and what
comes back for it (``Outputs``). The scheduler builds passes of these and the engine's lanes decode them; both import
it from here, so the pure loop and scheduler import without llama.cpp."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Outputs = list[int] | np.ndarray  # a pass's token ids (greedy), or its logits rows


@dataclass(frozen=True, slots=True)
class Part:
    """One lane's share of a pass: its tokens, and what comes back for them ("ids", "logits", or None: a prompt
    chunk that only extends the lane's cache)."""

    lane: int
    tokens: Sequence[int]
    want: str | None = "ids"


def reads_ids(greedy: bool, constrained: bool) -> bool:
    """Whether a sequence's rows come back as token ids (no logits copied): greedy, and under no grammar, which may
    need a greedy row's logits (its argmax forbidden). The one rule for a lane (engine/lanes.py) and its generator
    (speculative/loop.py)."""
    return greedy and not constrained
