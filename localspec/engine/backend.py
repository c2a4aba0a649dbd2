"""Process-wide llama.cpp state: backend initialisation, log routing, and which device runs the model."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections import deque
from pathlib import Path

import llama_cpp

_lock = threading.Lock()
_initialised = False
_verbose = False


# llama.cpp's last lines, kept while its log is off: a load that fails says why only there (which RPC server had
# no room, say), and the caller turns that into one line for the user
_recent: deque[str] = deque(maxlen=64)


@llama_cpp.llama_log_callback
def _drop_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp prints hundreds of lines per model load; a CLI's stderr belongs to the user.
    _recent.append(text.decode("utf-8", "replace"))


def recent_log(clear: bool = False) -> str:
    """llama.cpp's last log lines (none while --verbose sends them to stderr), joined; ``clear``: forget them after,
    so that the next call sees only what llama.cpp said since."""
    text = "".join(_recent)
    if clear:
        _recent.clear()
    return text


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once; route its logs to stderr only when ``verbose``."""
    global _initialised, _verbose
    with _lock:
        if not _initialised:
            llama_cpp.llama_backend_init()
            _initialised = True
        if verbose != _verbose or not _verbose:
            # A NULL callback (a CFUNCTYPE called without arguments; None is refused by the binding's argtypes)
            # restores llama.cpp's own logger, which writes to stderr.
            callback = llama_cpp.llama_log_callback() if verbose else _drop_log
            llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
            _verbose = verbose


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def library_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")


# Registered backends that are not a GPU (as named in llama_print_system_info).
_NOT_GPU = {"CPU", "BLAS", "RPC"}
_GPU_LIBRARY_NAMES = {"ggml-cuda": "CUDA", "ggml-metal": "Metal", "ggml-vulkan": "Vulkan", "ggml-hip": "ROCm",
                      "ggml-sycl": "SYCL", "ggml-musa": "MUSA"}


@functools.cache
def gpu_offload_supported() -> bool:
    """Whether this llama.cpp can put layers on a GPU: a GPU build *and* a GPU device it can use. (Not
    llama_supports_gpu_offload alone: an RPC build says yes to it with no GPU at all.)"""
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    ggml = ggml_lib()
    return any(ggml.ggml_backend_dev_type(ggml.ggml_backend_dev_get(i)) in _GPU_TYPES
               for i in range(ggml.ggml_backend_dev_count()))


_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU


@functools.cache
def gpu_backend_name() -> str:
    """The GPU backend's name ("CUDA", "Metal", …): llama-cpp-python binds no ggml_backend_dev_* function, so
    it is read from llama_print_system_info (one "NAME : FEATURE = VALUE | …" section per backend that lists
    features), else from the backend libraries shipped beside libllama."""
    for part in system_info().split("|"):
        name, sep, _ = part.partition(" : ")
        if sep and name.strip() and name.strip() not in _NOT_GPU:
            return name.strip()
    from localspec._native import library_dir

    lib_dir = library_dir()
    names = [p.name for p in lib_dir.iterdir()] if lib_dir is not None and lib_dir.is_dir() else []
    for lib, label in _GPU_LIBRARY_NAMES.items():
        if any(n.startswith((f"lib{lib}.", f"{lib}.")) for n in names):
            return label
    return "GPU"


def graphs_in_use(remote: bool, gpu_layers: int) -> bool:
    """Whether a model's passes run as CUDA graphs (whose replay wants a steady pass shape): ``gpu_layers``
    offloaded to a CUDA GPU of this machine (not ``remote``: on RPC servers), graphs not disabled
    (``GGML_CUDA_DISABLE_GRAPHS``)."""
    if remote or gpu_layers <= 0 or os.environ.get("GGML_CUDA_DISABLE_GRAPHS"):
        return False
    return gpu_backend_name() == "CUDA"


def offloaded_layers(requested: int, n_layer: int, remote: bool = False) -> int:
    """How many of the model's n_layer + 1 offloadable layers (the blocks and the output layer) llama.cpp puts
    on the GPU (``remote``: on RPC servers) for an ``n_gpu_layers`` of ``requested`` (negative: all)."""
    if not remote and not gpu_offload_supported():
        return 0
    return n_layer + 1 if requested < 0 else min(requested, n_layer + 1)


def describe_device(gpu_layers: int, n_layer: int, threads: int, remote: str = "") -> str:
    """Where a model with ``gpu_layers`` offloaded layers (of ``n_layer`` + 1) runs, in a few words; ``remote``:
    the RPC servers that hold them."""
    cpu = f"{threads} thread{'' if threads == 1 else 's'}"
    if remote and gpu_layers > 0:
        rest = "" if gpu_layers >= n_layer + 1 else f", the rest on the CPU ({cpu})"
        return f"RPC {remote}: {min(gpu_layers, n_layer + 1)} of {n_layer + 1} layers{rest}"
    if gpu_layers <= 0:
        return f"CPU ({cpu})"
    if gpu_layers >= n_layer + 1:
        return f"GPU: all {n_layer} layers offloaded ({gpu_backend_name()})"
    return (f"GPU: {gpu_layers} of {n_layer + 1} layers offloaded ({gpu_backend_name()}),"
            f" the rest on the CPU ({cpu})")


_lib: ctypes.CDLL | None = None


def ggml_lib() -> ctypes.CDLL:
    """libggml, as llama_cpp loaded it (the same handle: dlopen of a loaded library returns it)."""
    global _lib
    if _lib is None:
        folder = Path(llama_cpp.__file__).parent / "lib"
        names = sorted(folder.glob("libggml.so*")) + sorted(folder.glob("libggml.dylib")) + \
            sorted(folder.glob("ggml.dll"))
        if not names:
            raise RuntimeError(f"no libggml next to llama_cpp in {folder}")
        lib = ctypes.CDLL(str(names[0]))
        p = ctypes.c_void_p
        for name, args, ret in (
            ("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
            ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
            ("ggml_backend_register", [p], None),
            ("ggml_backend_reg_dev_count", [p], ctypes.c_size_t),
            ("ggml_backend_reg_dev_get", [p, ctypes.c_size_t], p),
            ("ggml_backend_dev_name", [p], ctypes.c_char_p),
            ("ggml_backend_dev_description", [p], ctypes.c_char_p),
            ("ggml_set_abort_callback", [p], p),
            ("ggml_backend_dev_count", [], ctypes.c_size_t),
            ("ggml_backend_dev_get", [ctypes.c_size_t], p),
            ("ggml_backend_dev_type", [p], ctypes.c_int),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ret
        _lib = lib
    return _lib
