"""Write a copy of a GGUF without some of its transformer blocks (llama.cpp's own quantize tool, copy mode)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from localspec.engine.backend import init_backend


def prune_layers(source: Path, dest: Path, layers: Sequence[int], *, threads: int = 2) -> None:
    """Copy ``source`` to ``dest`` without the blocks in ``layers``; tensors are copied, never requantised."""
    init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.only_copy = True
    params.nthread = threads
    wanted = (ctypes.c_int32 * (len(layers) + 1))(*layers, -1)  # llama.cpp reads up to a -1
    params.prune_layers = ctypes.cast(wanted, ctypes.POINTER(ctypes.c_int32))
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not write a pruned copy of {source.name} (code {rc})")
