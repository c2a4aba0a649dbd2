"""An inference context: the KV cache for one sequence, batched decoding, logits views, rollback.

The context mirrors what its KV cache holds in ``tokens`` (position i holds ``tokens[i]``), so callers can
sync it to any token history by keeping the common prefix and decoding the rest.

Three ways to decode: ``feed`` (extend the cache, no outputs), ``decode`` (logits rows, a zero-copy view) and
``decode_argmax`` (the argmax token of every position). Greedy work needs only the last: with ``greedy_rows`` set
and a llama.cpp that has backend sampling, a greedy sampler chain runs inside llama.cpp's graph and only token
ids come back (no 1 MB-per-position logits copy, no argmax in Python). llama.cpp copies no raw logits for a
sequence that has a backend sampler, so ``decode`` detaches the chain first and ``decode_argmax`` attaches a
fresh one (a chain can be initialised once); each switch makes llama.cpp re-reserve its graph on the next pass,
so a greedy loop never switches (it feeds prompts and verifies with ``decode_argmax``), and a logits user (bench's
near-tie check, sampling with temperature) pays once per switch. ``greedy_rows`` also caps every pass's outputs
(llama.cpp otherwise reserves compute memory for n_batch rows of logits, and with a sampler a padded copy too).

Ties: numpy's argmax takes the first of equal maxima, ggml's CPU argmax the last, its CUDA argmax the one its
parallel reduction keeps. Exact float ties at the top are rare; where one occurs both paths give a maximal token.
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

    def __init__(
        self, model: Model, *, n_ctx: int = 4096, n_threads: int = 2, n_batch: int = 512, greedy_rows: int = 0
    ) -> None:
        """``greedy_rows`` > 0: the most positions one pass scores, logits or argmax (a verifier's k_max + 1), and
        ``decode_argmax`` served by llama.cpp's backend greedy sampler where this build has one; 0: up to n_batch
        positions, and ``decode_argmax`` takes numpy's argmax of the logits."""
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
        # The chain must outlive the context: llama.cpp keeps the pointer, not a copy.
        self._chain: llama_cpp.llama_sampler_p | None = None
        if greedy_rows > 0:
            # llama.cpp sizes its compute buffer for the most outputs a pass may have (n_batch by default: 512
            # logits rows, 512 MiB with a 262k vocabulary; twice that with a sampler, which pads a copy of them)
            params.n_outputs_max = min(greedy_rows, n_batch)
            if backend_sampling_available():
                self._chain = _greedy_chain()
                config = llama_cpp.llama_sampler_seq_config(0, ctypes.cast(self._chain, ctypes.c_void_p))
                params.samplers = ctypes.pointer(config)
                params.n_samplers = 1
                params.n_outputs_max_per_seq = params.n_outputs_max
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            self._free_chain()
            raise ContextFullError(
                f"llama.cpp could not create a {n_ctx}-token context for {model.path.name}: try a smaller --ctx"
            )
        self._handle: llama_cpp.llama_context_p | None = handle
        # Backend sampling is usable only if the greedy stage went into the graph: llama.cpp names an initialised
        # stage "+greedy" when the output device runs its ops, "-greedy" when not (it then samples nothing).
        self.backend_sampling = self._chain is not None and _stage_name(self._chain) == b"+greedy"
        if self._chain is not None and not self.backend_sampling:
            self._detach()
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
        # the most positions one pass scores (llama.cpp aborts on more outputs than it reserved for)
        self.max_rows: int = min(greedy_rows, n_batch) if greedy_rows > 0 else n_batch

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
        if all_logits and len(tokens) > self.max_rows:
            raise ValueError(f"logits for {len(tokens)} positions: this context scores at most {self.max_rows}")
        if self._chain is not None:
            self._detach()
        self._run(tokens, all_outputs=all_logits)
        return self._logits(len(tokens) if all_logits else 1)

    def decode_argmax(self, tokens: Sequence[int]) -> list[int]:
        """Append ``tokens`` to the cache; return the argmax token id at every position (at most max_rows)."""
        n = len(tokens)
        if n > self.max_rows:
            raise ValueError(f"decode_argmax: this context scores at most {self.max_rows} positions, got {n}")
        if not self.backend_sampling:
            return self.decode(tokens, all_logits=True).argmax(axis=1).tolist()
        if self._chain is None:
            self._attach()
        self._run(tokens, all_outputs=True)
        ids = [llama_cpp.llama_get_sampled_token_ith(self.handle, i) for i in range(n)]
        if llama_cpp.LLAMA_TOKEN_NULL in ids:
            raise RuntimeError("llama.cpp's backend sampler returned no token")
        return ids

    def feed(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the cache without computing any output (a prompt, a rebuilt history)."""
        self._run(tokens, all_outputs=False, last_output=False)

    def _run(self, tokens: Sequence[int], *, all_outputs: bool, last_output: bool = True) -> None:
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
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            m = len(chunk)
            self._tok[:m] = chunk
            self._pos[:m] = np.arange(self.n_past, self.n_past + m, dtype=np.int32)
            self._want[:m] = 1 if all_outputs else 0
            if last_output and start + m == n:
                self._want[m - 1] = 1
            self._batch.n_tokens = m
            rc = llama_cpp.llama_decode(self.handle, self._batch)
            if rc != 0:
                if rc == 1:
                    raise ContextFullError("llama.cpp found no room in the KV cache: raise --ctx")
                raise RuntimeError(f"llama_decode failed with code {rc}")
            self.tokens.extend(chunk)

    def _attach(self) -> None:
        chain = _greedy_chain()
        if not llama_cpp.llama_set_sampler(self.handle, 0, chain):
            llama_cpp.llama_sampler_free(chain)
            raise RuntimeError("llama.cpp refused the backend greedy sampler it accepted before")
        self._chain = chain

    def _detach(self) -> None:
        llama_cpp.llama_set_sampler(self.handle, 0, None)
        # llama.cpp drops every graph built with the old chain before its next pass: freeing it now is safe
        self._free_chain()

    def _free_chain(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

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
            self._free_chain()

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


def backend_sampling_available() -> bool:
    """Whether this llama-cpp-python exposes llama.cpp's backend sampling (checked once per context)."""
    fields = {name for name, *_ in llama_cpp.llama_context_params._fields_}
    return {"samplers", "n_samplers", "n_outputs_max_per_seq"} <= fields and all(
        hasattr(llama_cpp, f) for f in ("llama_set_sampler", "llama_get_sampled_token_ith", "llama_sampler_chain_get")
    )


def _greedy_chain() -> llama_cpp.llama_sampler_p:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return chain


def _stage_name(chain: llama_cpp.llama_sampler_p) -> bytes:
    return llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, 0)) or b""
