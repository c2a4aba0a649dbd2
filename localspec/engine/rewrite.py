"""Write a modified copy of a GGUF with llama.cpp's own quantizer in copy mode (tensors copied, never requantised):
without some transformer blocks (the early-exit draft), or with integer metadata overridden."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path

import llama_cpp

from localspec.engine.backend import init_backend


def copy_model(
    source: Path,
    dest: Path,
    *,
    prune_layers: Sequence[int] = (),
    int_overrides: Mapping[str, int] | None = None,
    threads: int = 2,
) -> None:
    init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.only_copy = True
    params.nthread = threads
    if prune_layers:
        wanted = (ctypes.c_int32 * (len(prune_layers) + 1))(*prune_layers, -1)  # llama.cpp reads up to a -1
        params.prune_layers = ctypes.cast(wanted, ctypes.POINTER(ctypes.c_int32))
    if int_overrides:
        # an array ending with an entry whose key is empty, as llama.cpp expects
        overrides = (llama_cpp.llama_model_kv_override * (len(int_overrides) + 1))()
        for slot, (key, value) in zip(overrides, int_overrides.items()):
            slot.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
            slot.key = key.encode()
            slot.value.val_i64 = value
        params.kv_overrides = ctypes.cast(overrides, ctypes.POINTER(llama_cpp.llama_model_kv_override))
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not write a modified copy of {source.name} (code {rc})")
