"""A target's blocks kept as a model of their own, for self-speculation: the one builder of both subsets, early exit's
(the first L blocks: drafters/early_exit.py) and layer skip's (the first and last, interior ones skipped:
drafters/layer_skip.py).

The kept blocks are written once as a GGUF: llama.cpp's copy-mode quantizer drops the others and renumbers the kept
ones 0..n-1 in order (src/llama-quant.cpp ``remap_layer``; it sets ``block_count`` and leaves every other key as it
was). Two things the renumbering would silently change are put back here:
- per-layer metadata arrays keep one entry per *original* block: they are cut to the kept blocks;
- where llama.cpp derives a per-layer property from the block index, a subset whose blocks move says it outright.
  Gemma 3 marks every 6th block (5, 11, 17) global and the rest sliding-window unless the file carries
  ``gemma3.attention.sliding_window_pattern`` (llama-model.cpp ``load_swa_pattern``: an array, when present,
  overrides the rule). Renumbered, a global block would become local: different attention and a different RoPE
  base. Such a subset gets the array, with each kept block's original kind. Early exit's blocks keep their
  indices, so nothing derived from them moves, on any architecture.

The file is cached under a name the caller gives (derived from the target's content hash), and appears under it
only once written and checked.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from localspec.engine.rewrite import copy_model
from localspec.errors import UserError
from localspec.gguf import edit as gguf_edit
from localspec.gguf.header import ArrayLength, GGUFHeader, read_header
from localspec.settings import parse_blocks

# architectures whose sliding-window layers llama.cpp assigns by block index, as (default period, dense first), read
# from their load_arch_hparams (src/models/*.cpp); a block il is sliding-window when il % period < period - 1
SWA_BY_INDEX: dict[str, tuple[int, bool]] = {"gemma3": (6, False)}
# architectures that have no per-layer property tied to the block index here (checked in src/models/qwen2.cpp)
PLAIN = {"qwen2", "llama", "qwen3"}


@dataclass(frozen=True)
class Subset:
    """Which of a target's ``n_layer`` blocks a layer-skip draft leaves out."""

    n_layer: int
    skipped: tuple[int, ...]

    @property
    def kept(self) -> list[int]:
        return [i for i in range(self.n_layer) if i not in self.skipped]

    @property
    def renumbers(self) -> bool:
        """Whether a kept block gets another index (not so where only the tail is dropped)."""
        return self.kept != list(range(len(self.kept)))

    @classmethod
    def first(cls, n_kept: int, n_layer: int) -> Subset:
        """The first ``n_kept`` of ``n_layer`` blocks: early exit's."""
        return cls(n_layer, tuple(range(n_kept, n_layer)))

    @property
    def slug(self) -> str:
        """The skipped blocks as ranges ("4-9,12"): how users write them, and part of the cached file's name."""
        spans: list[str] = []
        for i in self.skipped:
            if spans and int(spans[-1].split("-")[-1]) == i - 1:
                spans[-1] = f"{spans[-1].split('-')[0]}-{i}"
            else:
                spans.append(str(i))
        return ",".join(spans)

    @classmethod
    def parse(cls, spec: str, n_layer: int) -> Subset:
        """``--skip-layers`` ("8-19", "4,6-9") for a model of ``n_layer`` blocks; the first and last must stay."""
        skipped = parse_blocks(spec)
        if min(skipped) < 1 or max(skipped) > n_layer - 2:
            raise UserError(f"--skip-layers must name blocks between 1 and {n_layer - 2} (this model has {n_layer}, "
                            f"numbered from 0; the first and last stay), not {spec!r}")
        return cls(n_layer, tuple(sorted(skipped)))


def subset_model(target: Path, subset: Subset, out: Path, building: str) -> Path:
    """``out``: ``target`` without ``subset.skipped``, built on first use (``building`` is said as it starts)."""
    if out.exists():
        return out
    source = read_header(target)
    arrays = subset_arrays(target, source, subset)  # a model it cannot carry over is refused before any writing
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"localspec: {building}…", file=sys.stderr)
    pruned, tmp = out.with_suffix(f".{os.getpid()}.pruned.tmp"), out.with_suffix(f".{os.getpid()}.tmp")
    try:
        copy_model(target, pruned if arrays else tmp, prune_layers=list(subset.skipped))
        if arrays:
            gguf_edit.set_arrays(pruned, tmp, arrays)
        check_subset(source, tmp, subset, arrays)
        os.replace(tmp, out)
    finally:
        pruned.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


def swa_layers(header: GGUFHeader) -> list[bool] | None:
    """Which blocks llama.cpp runs with sliding-window attention, as it decides (None: the model has none)."""
    arch, path = header.architecture or "", header.path
    key = f"{arch}.attention.sliding_window_pattern"
    if not header.metadata.get(f"{arch}.attention.sliding_window"):
        return None
    found = gguf_edit.read_array(path, key)
    if found is not None:
        return [bool(v) for v in found[1]]
    if arch not in SWA_BY_INDEX:
        raise UserError(f"layer-skip cannot keep the sliding-window layers of a {arch!r} model where they are: "
                        "use --drafter early-exit or draft")
    period, dense_first = SWA_BY_INDEX[arch]
    value = header.metadata.get(key)
    period = value if isinstance(value, int) and not isinstance(value, ArrayLength) else period
    n = header.block_count or 0
    if dense_first:
        return [period == 0 or i % period != 0 for i in range(n)]
    return [period == 0 or i % period < period - 1 for i in range(n)]


def subset_arrays(target: Path, header: GGUFHeader, subset: Subset) -> dict[str, tuple[int, list]]:
    """The arrays the subset's file must carry: every per-layer array cut to the kept blocks, and the
    sliding-window pattern where llama.cpp would otherwise read it off the renumbered blocks."""
    arch = header.architecture or ""
    if subset.renumbers and arch not in PLAIN and arch not in SWA_BY_INDEX:
        raise UserError(f"layer-skip has not been checked on {arch!r} models (per-layer properties tied to the block "
                        "index would move): use --drafter early-exit or draft")
    arrays: dict[str, tuple[int, list]] = {}
    for key, value in header.metadata.items():
        if key.startswith(f"{arch}.") and isinstance(value, ArrayLength) and value == subset.n_layer:
            found = gguf_edit.read_array(target, key)
            if found is None:
                raise UserError(f"layer-skip cannot cut the per-layer array {key} of this model")
            etype, values = found
            arrays[key] = (etype, [values[i] for i in subset.kept])
    swa = swa_layers(header) if subset.renumbers else None
    if swa is not None:
        arrays[f"{arch}.attention.sliding_window_pattern"] = (gguf_edit.BOOL, [swa[i] for i in subset.kept])
    return arrays


def check_subset(source: GGUFHeader, path: Path, subset: Subset, arrays: dict[str, tuple[int, list]]) -> None:
    """The copy must describe exactly the kept blocks: its block count, every per-layer array and its tensors."""
    header, n = read_header(path), len(subset.kept)
    if header.block_count != n:
        raise RuntimeError(f"the subset has block_count {header.block_count}, expected {n}")
    for key, value in source.metadata.items():
        if isinstance(value, ArrayLength) and value == source.block_count and header.metadata.get(key) != n:
            raise RuntimeError(f"the subset's {key} has {header.metadata.get(key)} entries, expected {n}")
    for key, (_etype, values) in arrays.items():
        found = gguf_edit.read_array(path, key)
        if found is None or found[1] != list(values):
            raise RuntimeError(f"the subset's {key} is not what was written")
    blocks = {t.name.split(".")[1] for t in header.tensors if t.name.startswith("blk.")}
    if blocks != {str(i) for i in range(n)}:
        raise RuntimeError(f"the subset has blocks {sorted(blocks, key=int)}, expected 0..{n - 1}")
    skipped = {f"blk.{i}" for i in subset.skipped}
    expected = source.tensor_count - sum(".".join(t.name.split(".")[:2]) in skipped for t in source.tensors)
    if header.tensor_count != expected:
        raise RuntimeError(f"the subset has {header.tensor_count} tensors, expected {expected}")
