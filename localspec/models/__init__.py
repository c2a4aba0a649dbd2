"""Model files: naming them (registry), finding and checking them on disk, and getting them (hub, embedded).

Inference (runtime, engine, speculative, drafters) imports only ``files`` (paths, hashes, atomic writes),
``registry`` (turning a name into a path), and reads headers with ``localspec.gguf``; never the downloader
in ``hub`` nor huggingface_hub (tests/test_inference_imports.py). Importing this package imports none of its modules.
"""
