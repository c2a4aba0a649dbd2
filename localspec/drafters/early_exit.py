"""Self-speculation: the draft is the target's own first L blocks (then its final norm and LM head).

The truncated GGUF is written once with llama.cpp's copy-mode quantizer (pruning blocks L..n-1), cached under a
name derived from the target's content hash and L, checked, and reused by every later run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from localspec.engine.rewrite import copy_model
from localspec.errors import UserError
from localspec.gguf.header import ArrayLength, read_header
from localspec.models.files import known_sha256
from localspec.paths import cache_dir


def default_exit_layer(n_layer: int) -> int:
    # a third of the depth: deep enough to agree often, shallow enough to be cheaper than the target
    return max(1, n_layer // 3)


def early_exit_model(target: Path, exit_layer: int, n_layer: int) -> Path:
    """The path of the target truncated to ``exit_layer`` blocks, building it on first use."""
    if not (1 <= exit_layer < n_layer):
        raise UserError(f"--exit-layer must be between 1 and {n_layer - 1} for this {n_layer}-layer model")
    out = cache_dir() / "early-exit" / f"{known_sha256(target)[:16]}-L{exit_layer}.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"localspec: building the early-exit draft ({exit_layer} of {n_layer} layers)…", file=sys.stderr)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        copy_model(target, tmp, prune_layers=list(range(exit_layer, n_layer)))
        check_pruned(target, tmp, exit_layer)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def check_pruned(source: Path, path: Path, exit_layer: int) -> None:
    """The copy must describe exactly ``exit_layer`` blocks, in its block count and in every per-layer array."""
    before, header = read_header(source), read_header(path)
    if header.block_count != exit_layer:
        raise RuntimeError(f"pruned model has block_count {header.block_count}, expected {exit_layer}")
    for key, value in before.metadata.items():
        # per-layer arrays (head counts, sliding-window flags…) hold one entry per block
        if isinstance(value, ArrayLength) and value == before.block_count:
            got = header.metadata.get(key)
            if got != exit_layer:
                raise RuntimeError(f"pruned model's {key} has {got} entries, expected {exit_layer}")
    blocks = {t.name.split(".")[1] for t in header.tensors if t.name.startswith("blk.")}
    if blocks != {str(i) for i in range(exit_layer)}:
        raise RuntimeError(f"pruned model has blocks {sorted(blocks, key=int)}, expected 0..{exit_layer - 1}")
