"""Self-speculation: the draft is the target's own first L blocks (then its final norm and LM head).

Built once by drafters/block_subset.py (the subset that drops the tail), cached under a name derived from the
target's content hash and L (the name it has always had: a file built before is found), and reused by every later
run.
"""

from __future__ import annotations

from pathlib import Path

from localspec.drafters.block_subset import Subset, subset_model
from localspec.errors import UserError
from localspec.models.files import known_sha256
from localspec.paths import cache_dir


def default_exit_layer(n_layer: int) -> int:
    # a third of the depth: deep enough to agree often, shallow enough to be cheaper than the target
    return max(1, n_layer // 3)


def check_exit_layer(exit_layer: int, n_layer: int) -> None:
    if not (1 <= exit_layer < n_layer):
        raise UserError(f"--exit-layer must be between 1 and {n_layer - 1} for this {n_layer}-layer model")


def early_exit_model(target: Path, exit_layer: int, n_layer: int) -> Path:
    """The path of the target truncated to ``exit_layer`` blocks, building it on first use."""
    check_exit_layer(exit_layer, n_layer)
    out = cache_dir() / "early-exit" / f"{known_sha256(target)[:16]}-L{exit_layer}.gguf"
    return subset_model(target, Subset.first(exit_layer, n_layer), out,
                        f"building the early-exit draft ({exit_layer} of {n_layer} layers)")
