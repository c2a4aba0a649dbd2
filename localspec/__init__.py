"""localspec: lossless speculative decoding for local GGUF models on llama.cpp."""

# First of all, before anything can import numpy: load llama.cpp's shared libraries. Importing numpy before them
# crashes a CUDA build's first model load; localspec/_native.py says why and how (README 'GPU').
from localspec._native import load_llama_libraries

load_llama_libraries()

__version__ = "0.1.0"
