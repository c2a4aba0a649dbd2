"""GGUF files read and edited without llama.cpp: ``header`` reads a file's header (the engine, pull and `models`
use it), ``edit`` rewrites its metadata arrays (layer-skip drafts). Below engine and models, which both use it."""
