"""Self-speculation by skipping interior blocks: the draft is the target's first and last blocks, its embeddings,
final norm and LM head (Draft & Verify, Zhang et al. 2023; no training). Early exit (early_exit.py) keeps the first
L blocks instead, and its drafts rarely agree: the last blocks are what turn the residual stream into the next token.
Both are built by drafters/block_subset.py.
"""

from __future__ import annotations

from pathlib import Path

from localspec.drafters.block_subset import Subset, subset_model
from localspec.models.files import known_sha256
from localspec.paths import cache_dir


def default_skip(n_layer: int) -> str:
    """What ``--drafter layer-skip`` skips when not told: the middle third of the blocks, the best-agreeing subset
    measured on Qwen2.5-Coder 1.5B (9-18 of 28: 79% against 53% for the middle half; docs/performance.md,
    "Self-speculation by skipping blocks")."""
    return f"{n_layer // 3}-{n_layer - 1 - n_layer // 3}"


def layer_skip_model(target: Path, subset: Subset) -> Path:
    """The path of ``target`` without ``subset.skipped``, building it on first use."""
    out = cache_dir() / "layer-skip" / f"{known_sha256(target)[:16]}-skip{subset.slug}.gguf"
    return subset_model(target, subset, out, f"building the layer-skip draft ({len(subset.kept)} of "
                                              f"{subset.n_layer} blocks)")
