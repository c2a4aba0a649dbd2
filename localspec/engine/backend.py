"""Process-wide llama.cpp state: backend initialisation and log routing."""

from __future__ import annotations

import ctypes
import threading

import llama_cpp

_lock = threading.Lock()
_initialised = False
_verbose = False


@llama_cpp.llama_log_callback
def _drop_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp prints hundreds of lines per model load; a CLI's stderr belongs to the user.
    return None


def init_backend(verbose: bool = False) -> None:
    """Initialise llama.cpp once; route its logs to stderr only when ``verbose``."""
    global _initialised, _verbose
    with _lock:
        if not _initialised:
            llama_cpp.llama_backend_init()
            _initialised = True
        if verbose != _verbose or not _verbose:
            llama_cpp.llama_log_set(None if verbose else _drop_log, ctypes.c_void_p(0))
            _verbose = verbose


def system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def library_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")
