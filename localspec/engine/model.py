"""A loaded GGUF model: weights, vocabulary, metadata. Freed deterministically (use as a context manager)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp

from localspec.engine.backend import graphs_in_use, init_backend, offloaded_layers, recent_log
from localspec.engine.rpc import no_room
from localspec.engine.vocab import Vocab
from localspec.errors import ModelLoadError


def check_file(path: Path) -> None:
    """Give the user a precise reason before llama.cpp gives a vague one (or none)."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path} (check the path, or use a name from `localspec models`)")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not a GGUF model file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF model file (it does not start with 'GGUF'): "
            "convert it with llama.cpp's convert_hf_to_gguf.py or pick a .gguf file"
        )


def _refusal(path: Path) -> ModelLoadError:
    """Why llama.cpp refused a GGUF file. Reading the header costs 0.1–0.7 s (a 262k-token vocabulary is parsed to
    reach the tensors), so it is done only once llama.cpp has refused the file, never on the way to a load."""
    from localspec.gguf.header import check_complete

    check_complete(path)  # raises with the precise reason (truncated, bad header, ...)
    return ModelLoadError(
        f"llama.cpp could not load {path}: the file is corrupt, or uses an architecture this llama-cpp-python "
        "does not support (run with --verbose to see llama.cpp's reason)"
    )


class Model:
    """A ``llama_model*`` with the facts the rest of localspec needs about it."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_gpu_layers: int = 0,
        verbose: bool = False,
        cancelled: Callable[[], bool] | None = None,
        devices: Sequence[int] = (),
        tensor_split: Sequence[float] = (),
        remote: str = "",
        vocab_only: bool = False,
    ) -> None:
        """``cancelled`` is polled during the load (a Ctrl-C flag): when it turns true the load stops and
        KeyboardInterrupt is raised. A signal cannot interrupt llama.cpp itself; it can only be noticed here.
        ``devices``: the ``ggml_backend_dev_t`` to offload to instead of every local one (RPC servers';
        engine/rpc.py), with the share of the layers each takes in ``tensor_split`` (empty: by their memory);
        ``remote`` names them (the servers' endpoints) for reports and the calibration cache. ``vocab_only``: the
        tokenizer alone, no weights (a draft's tokenizer checked before anything costly is done)."""
        self.remote = remote if devices else ""
        self.path = Path(path)
        check_file(self.path)
        init_backend(verbose)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 999
        params.vocab_only = vocab_only
        if devices:
            # NULL-terminated; kept on self: llama.cpp reads them during the load only, but cheaply kept
            self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            if tensor_split:
                split = list(tensor_split) + [0.0] * (llama_cpp.LLAMA_MAX_DEVICES - len(tensor_split))
                self._split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*split[: llama_cpp.LLAMA_MAX_DEVICES])
                params.tensor_split = self._split
        if cancelled is not None:

            @llama_cpp.llama_progress_callback
            def go_on(progress: float, user_data: ctypes.c_void_p) -> bool:
                return not cancelled()

            params.progress_callback = go_on  # the local keeps the C callback alive through the load
        recent_log(clear=True)
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            if cancelled is not None and cancelled():
                raise KeyboardInterrupt
            if devices:
                full = no_room(recent_log(), f"{self.path.name}'s layers",
                               "give it a smaller share with --tensor-split, add a server")
                if full is not None:
                    raise ModelLoadError(str(full))
            raise _refusal(self.path)
        self._handle: llama_cpp.llama_model_p | None = handle
        self.vocab = Vocab(llama_cpp.llama_model_get_vocab(handle))
        self.n_layer: int = llama_cpp.llama_model_n_layer(handle)
        # layers on the GPU, of n_layer + 1 (the blocks and the output layer): 0 where llama.cpp cannot offload
        self.gpu_layers: int = offloaded_layers(n_gpu_layers, self.n_layer, remote=bool(self.remote))
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.architecture: str = self.meta("general.architecture") or "unknown"
        self.can_rollback: bool = not (
            llama_cpp.llama_model_is_recurrent(handle) or llama_cpp.llama_model_is_hybrid(handle)
        )

    @property
    def graphs(self) -> bool:
        """Whether this model's passes run as CUDA graphs (a steady pass shape replays them: speculative/shapes.py)."""
        return graphs_in_use(bool(self.remote), self.gpu_layers)

    @property
    def handle(self) -> llama_cpp.llama_model_p:
        if self._handle is None:
            raise RuntimeError("model used after close()")
        return self._handle

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self.handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.handle, None)
        return raw.decode("utf-8", "replace") if raw else None

    def close(self) -> None:
        if self._handle is not None:
            llama_cpp.llama_model_free(self._handle)
            self._handle = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a safety net only: callers close explicitly
        try:
            self.close()
        except Exception:
            pass
