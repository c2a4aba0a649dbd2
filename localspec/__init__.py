"""localspec: lossless speculative decoding for local GGUF models on llama.cpp."""

# First of all, before anything can import numpy: load llama.cpp's shared libraries. Importing numpy before them
# crashes a CUDA build's first model load; localspec/_native.py says why and how (README 'GPU').
from localspec._native import load_llama_libraries

load_llama_libraries()

from localspec._version import __version__ as __version__  # noqa: E402 (after the libraries, as all)


def __getattr__(name: str) -> object:
    # the batch API loads the engine (numpy, llama.cpp's wrappers): only when a script asks for it, so that
    # `import localspec` (every CLI start, `--help` too) stays light
    if name in ("generate_many", "generate"):
        from localspec.batch import api

        return getattr(api, name)
    raise AttributeError(f"module 'localspec' has no attribute {name!r}")
