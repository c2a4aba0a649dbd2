"""An inference context: the KV cache for one sequence, batched decoding, logits views, rollback.

The context mirrors what its KV cache holds in ``tokens`` (position i holds ``tokens[i]``), so callers can
sync it to any token history by keeping the common prefix and decoding the rest.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Sequence

import llama_cpp
import numpy as np

from localspec.engine.model import Model
from localspec.errors import ContextFullError, RollbackUnsupported


class Context:
    """A ``llama_context*`` for sequence 0, with a reusable batch whose arrays are numpy views."""

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_threads: int = 2, n_batch: int = 512) -> None:
        self.model = model
        n_ctx = min(n_ctx, model.n_ctx_train) if model.n_ctx_train > 0 else n_ctx
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        # Sliding-window models (Gemma 3) can drop a suffix of positions only with a full-size SWA cache.
        params.swa_full = True
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            raise ContextFullError(
                f"llama.cpp could not create a {n_ctx}-token context for {model.path.name}: try a smaller --ctx"
            )
        self._handle: llama_cpp.llama_context_p | None = handle
        self._memory = llama_cpp.llama_get_memory(handle)
        self.n_ctx: int = llama_cpp.llama_n_ctx(handle)
        # llama.cpp may round the context up and clamp the batch to it: use what it actually set
        n_batch = self.n_batch = min(n_batch, llama_cpp.llama_n_batch(handle), llama_cpp.llama_n_ubatch(handle))
        self.n_vocab: int = model.vocab.n_tokens
        self.tokens: list[int] = []
        # One batch, allocated once; its arrays are written through numpy views, not per-element ctypes.
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))[:] = 1
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0
        self._logit_types: dict[int, type] = {}
        self._thread: int | None = None  # the thread that decodes; see _check_thread

    @property
    def handle(self) -> llama_cpp.llama_context_p:
        if self._handle is None:
            raise RuntimeError("context used after close()")
        return self._handle

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Append ``tokens`` to the cache; return logits rows (all tokens, or only the last) as a view.

        The view is valid only until the next decode on this context.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode() needs at least one token")
        if self._thread != threading.get_ident():
            self._check_thread()
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(
                f"context full: {self.n_past + n} tokens do not fit in --ctx {self.n_ctx} "
                "(raise --ctx or shorten the prompt)"
            )
        if all_logits and n > self.n_batch:
            raise ValueError(f"logits for {n} positions exceed the batch size {self.n_batch}")
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            m = len(chunk)
            last_chunk = start + m == n
            self._tok[:m] = chunk
            self._pos[:m] = np.arange(self.n_past, self.n_past + m, dtype=np.int32)
            self._want[:m] = 1 if all_logits else 0
            if last_chunk:
                self._want[m - 1] = 1
            self._batch.n_tokens = m
            rc = llama_cpp.llama_decode(self.handle, self._batch)
            if rc != 0:
                if rc == 1:
                    raise ContextFullError("llama.cpp found no room in the KV cache: raise --ctx")
                raise RuntimeError(f"llama_decode failed with code {rc}")
            self.tokens.extend(chunk)
        return self._logits(n if all_logits else 1)

    def _check_thread(self) -> None:
        # llama.cpp's CPU backend keeps an OpenMP thread team per calling thread: decoding from a second thread
        # starts a second team, and on a small machine the two slow each other down for the rest of the process
        # (measured: the chat ran at 57% of `run`). Keep all llama.cpp work on one thread.
        me = threading.get_ident()
        if self._thread is not None:
            warnings.warn(
                "this llama.cpp context is decoded from more than one thread, which slows llama.cpp down: "
                "run all its work on one thread",
                RuntimeWarning,
                stacklevel=3,
            )
        self._thread = me

    def _logits(self, rows: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self.handle)
        array_type = self._logit_types.get(rows)
        if array_type is None:
            array_type = self._logit_types[rows] = ctypes.c_float * (rows * self.n_vocab)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        return np.frombuffer(array_type.from_address(address), dtype=np.float32).reshape(rows, self.n_vocab)

    def truncate(self, n_keep: int) -> None:
        """Drop every position >= n_keep from the cache, and check that it happened."""
        if n_keep >= self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            raise RollbackUnsupported(f"{self.model.path.name} cannot drop cached positions (recurrent model?)")
        pos_max = llama_cpp.llama_memory_seq_pos_max(self._memory, 0)
        if pos_max != n_keep - 1:
            raise RollbackUnsupported(f"rollback left position {pos_max} in the cache, expected {n_keep - 1}")
        del self.tokens[n_keep:]

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        self.tokens.clear()

    def close(self) -> None:
        if self._handle is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._handle)
            self._handle = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
