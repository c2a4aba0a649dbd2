"""Load llama.cpp's shared libraries into the process before anything can import numpy.

Why: on a CUDA build of llama-cpp-python, a process that imports numpy *before* llama_cpp has loaded its
libraries segfaults at the first model load (measured on an H100, CUDA 13: in ``llama_model::print_info``, a
libstdc++ call bound to the copy inside ``libggml-cuda.so``). Loading llama_cpp's libraries first fixes it.
``import llama_cpp`` would do that, but it also imports numpy, jinja2 and more: too slow for ``localspec --help``.

So ``localspec/__init__.py`` calls :func:`load_llama_libraries` before it imports anything else: it finds the
llama_cpp package without executing it (``importlib.util.find_spec``) and dlopens ``lib/libllama`` exactly as
llama_cpp's ``load_shared_library`` does (same path, same ``ctypes.CDLL`` mode), so its dependencies (libggml,
libggml-base, libggml-cpu, libggml-cuda, …) are loaded and bound in the same order as by ``import llama_cpp``
first, and llama_cpp's own load later returns the same handle. Every entry point (the ``localspec`` script,
``python -m localspec``, ``import localspec.<anything>``, scripts, tests) imports the ``localspec`` package
first, so none can import numpy before this. This module must import neither numpy nor llama_cpp.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import warnings
from pathlib import Path

# Backends whose presence in llama_cpp/lib means a build with GPU offload (the crash above needs one).
_GPU_BACKENDS = ("ggml-cuda", "ggml-metal", "ggml-vulkan", "ggml-hip", "ggml-sycl", "ggml-musa")

NUMPY_FIRST_WARNING = (
    "numpy was imported before localspec: on this GPU build of llama-cpp-python that can crash the first model "
    "load (a segfault in llama_model::print_info). Import localspec (or llama_cpp) before numpy; see README 'GPU'."
)

_attempted = False
_library: ctypes.CDLL | None = None  # kept so that the library stays referenced for the life of the process


def library_dir() -> Path | None:
    """llama_cpp's ``lib`` folder, as llama_cpp/llama_cpp.py computes it, without importing llama_cpp."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override is not None:
        return Path(override)
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(os.path.abspath(next(iter(spec.submodule_search_locations)))) / "lib"


def _candidates(lib_dir: Path) -> list[Path]:
    # The names llama_cpp._ctypes_extensions.load_shared_library tries, in its order.
    if sys.platform.startswith(("linux", "freebsd")):
        return [lib_dir / "libllama.so"]
    if sys.platform == "darwin":
        return [lib_dir / "libllama.so", lib_dir / "libllama.dylib"]
    if sys.platform == "win32":
        return [lib_dir / "llama.dll", lib_dir / "libllama.dll"]
    return []  # emscripten and others: leave loading to llama_cpp


def _cdll_kwargs(lib_dir: Path) -> dict[str, int]:
    """The ``ctypes.CDLL`` arguments load_shared_library uses (the default mode, except on Windows)."""
    if sys.platform != "win32":
        return {}
    os.add_dll_directory(str(lib_dir))
    os.environ["PATH"] = str(lib_dir) + os.pathsep + os.environ["PATH"]
    for var, subdirs in (("CUDA_PATH", ("bin", "lib")), ("HIP_PATH", ("bin", "lib"))):
        if var in os.environ:
            for sub in subdirs:
                os.add_dll_directory(os.path.join(os.environ[var], sub))
    return {"winmode": ctypes.RTLD_GLOBAL}


def has_gpu_backend(lib_dir: Path | None = None) -> bool:
    """Whether this llama-cpp-python ships a GPU backend library (read from its files: nothing is loaded)."""
    lib_dir = lib_dir or library_dir()
    if lib_dir is None or not lib_dir.is_dir():
        return False
    names = [p.name for p in lib_dir.iterdir()]
    return any(n.startswith((f"lib{b}.", f"{b}.")) for n in names for b in _GPU_BACKENDS)


def load_llama_libraries() -> None:
    """Load libllama and its ggml libraries now (once per process). Never raises: where this fails, importing
    llama_cpp fails the same way later, with llama_cpp's own message."""
    global _attempted, _library
    if _attempted:
        return
    _attempted = True
    if "llama_cpp.llama_cpp" in sys.modules:
        return  # already loaded by llama_cpp itself
    numpy_first = "numpy" in sys.modules
    lib_dir = library_dir()
    if lib_dir is None:
        return
    for path in _candidates(lib_dir):
        if path.exists():
            try:
                _library = ctypes.CDLL(str(path), **_cdll_kwargs(lib_dir))
            except OSError:
                return
            break
    if numpy_first and has_gpu_backend(lib_dir):
        warnings.warn(NUMPY_FIRST_WARNING, RuntimeWarning, stacklevel=3)
