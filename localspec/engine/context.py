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

Token trees (``n_seq`` > 1): engine/trees.py's ``TreePasses``, mixed in.

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

from localspec.engine.backend import recent_log
from localspec.engine.model import Model
from localspec.engine.rpc import no_room
from localspec.engine.sampler_chain import backend_sampling_available, greedy_chain, stage_name
from localspec.engine.trees import TreePasses
from localspec.errors import ContextFullError, RollbackUnsupported
from localspec.machine import usable_cores


class Context(TreePasses):
    """A ``llama_context*`` for sequence 0, with a reusable batch whose arrays are numpy views."""

    def __init__(
        self, model: Model, *, n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512,
        greedy_rows: int = 0, n_seq: int = 1,
    ) -> None:
        """``greedy_rows`` > 0: the most positions one pass scores, logits or argmax (a verifier's k_max + 1), and
        ``decode_argmax`` served by llama.cpp's backend greedy sampler where this build has one; 0: up to n_batch
        positions, and ``decode_argmax`` takes numpy's argmax of the logits. ``n_seq``: the most branches a token
        tree may have (1: no trees)."""
        self.model = model
        n_ctx = min(n_ctx, model.n_ctx_train) if model.n_ctx_train > 0 else n_ctx
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        # one cache shared by all sequences: a tree's branches share the history's cells instead of copying them
        params.kv_unified = n_seq > 1
        params.n_threads = params.n_threads_batch = n_threads or usable_cores()
        params.no_perf = True
        # Sliding-window models (Gemma 3) can drop a suffix of positions only with a full-size SWA cache.
        params.swa_full = True
        # The chains must outlive the context: llama.cpp keeps the pointers, not copies. One per sequence: a tree
        # pass samples each row with its first sequence's chain (and copies raw logits if one lacks a chain).
        self.n_seq = n_seq
        self._chains: dict[int, llama_cpp.llama_sampler_p] = {}  # seq id → its greedy chain, while attached
        if greedy_rows > 0:
            # llama.cpp sizes its compute buffer for the most outputs a pass may have (n_batch by default: 512
            # logits rows, 512 MiB with a 262k vocabulary; twice that with a sampler, which pads a copy of them)
            params.n_outputs_max = min(greedy_rows, n_batch)
            if backend_sampling_available():
                self._chains = {s: greedy_chain() for s in range(n_seq)}
                configs = (llama_cpp.llama_sampler_seq_config * n_seq)(*(
                    llama_cpp.llama_sampler_seq_config(s, ctypes.cast(chain, ctypes.c_void_p))
                    for s, chain in self._chains.items()))
                self._configs = configs  # kept alive with the context, like the chains
                params.samplers = ctypes.cast(configs, ctypes.POINTER(llama_cpp.llama_sampler_seq_config))
                params.n_samplers = n_seq
                params.n_outputs_max_per_seq = params.n_outputs_max
        recent_log(clear=True)
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            self._free_chains()
            full = no_room(recent_log(), f"the context ({n_ctx} tokens in all: its KV cache and compute buffers)",
                           "try a smaller --ctx, give it a smaller share with --tensor-split") if model.remote else None
            if full is not None:
                raise ContextFullError(str(full))
            raise ContextFullError(
                f"llama.cpp could not create a {n_ctx}-token context for {model.path.name}: try a smaller --ctx"
            )
        self._handle: llama_cpp.llama_context_p | None = handle
        # Backend sampling is usable only if the greedy stage went into the graph: llama.cpp names an initialised
        # stage "+greedy" when the output device runs its ops, "-greedy" when not (it then samples nothing).
        self.backend_sampling = bool(self._chains) and stage_name(self._chains[0]) == b"+greedy"
        self.can_sample = self.backend_sampling  # backend_sampling: whether it is used (use_backend_sampler)
        if self._chains and not self.backend_sampling:
            self._detach()
        self._memory = llama_cpp.llama_get_memory(handle)
        self.n_ctx: int = llama_cpp.llama_n_ctx(handle)
        # llama.cpp may round the context up and clamp the batch to it: use what it actually set
        n_batch = self.n_batch = min(n_batch, llama_cpp.llama_n_batch(handle), llama_cpp.llama_n_ubatch(handle))
        self.n_vocab: int = model.vocab.n_tokens
        self.tokens: list[int] = []
        # One batch, allocated once; its arrays are written through numpy views, not per-element ctypes.
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        self._n_seq_id[:] = 1
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0
        self._logit_types: dict[int, type] = {}
        self._thread: int | None = None  # the thread that decodes; see _check_thread
        # the most positions one pass scores (llama.cpp aborts on more outputs than it reserved for)
        self.max_rows: int = min(greedy_rows, n_batch) if greedy_rows > 0 else n_batch
        # a tree pass's rows and the sequences each belongs to, until keep_path
        self._tree: tuple[list[int], list[list[int]]] | None = None

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
        if self._chains:
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
        if not self._chains:
            self._attach()
        self._run(tokens, all_outputs=True)
        return self._sampled(n)

    def _sampled(self, n: int, start: int = 0) -> list[int]:
        handle = self.handle
        ids = [llama_cpp.llama_get_sampled_token_ith(handle, i) for i in range(start, start + n)]
        if llama_cpp.LLAMA_TOKEN_NULL in ids:
            raise RuntimeError("llama.cpp's backend sampler returned no token")
        return ids

    # -- several sequences in one pass (the batch scheduler's; engine/lanes.py gives each sequence a view) --

    def decode_parts(self, parts: Sequence[tuple[int, int, Sequence[int], bool]]) -> list[int]:
        """One pass over several sequences' rows. Each part is (seq id, the position of its first token, its tokens,
        whether every token wants an output); positions are the caller's to keep. Returns each part's first batch
        index: read its rows with ``sampled_rows`` (sequences with a backend greedy chain) or ``logits_rows``."""
        n = sum(len(tokens) for _, _, tokens, _ in parts)
        outputs = sum(len(tokens) for _, _, tokens, want in parts if want)
        if n > self.n_batch or outputs > self.max_rows:
            raise ValueError(f"a pass of {n} tokens and {outputs} outputs: this context takes at most {self.n_batch} "
                             f"and {self.max_rows}")
        if self._thread != threading.get_ident():
            self._check_thread()
        starts: list[int] = []
        seq_ids = self._batch.seq_id
        i = 0
        for seq, pos, tokens, want in parts:
            m = len(tokens)
            self._tok[i : i + m] = tokens
            self._pos[i : i + m] = np.arange(pos, pos + m, dtype=np.int32)
            self._want[i : i + m] = 1 if want else 0
            if seq:
                for j in range(i, i + m):
                    seq_ids[j][0] = seq
            starts.append(i)
            i += m
        try:
            self._decode_batch(n)
        finally:  # the one-sequence passes put every token in sequence 0
            for (seq, _, tokens, _), start in zip(parts, starts, strict=True):
                if seq:
                    for j in range(start, start + len(tokens)):
                        seq_ids[j][0] = 0
        return starts

    def sampled_rows(self, start: int, n: int) -> list[int]:
        """The backend-sampled token ids of batch rows start..start+n-1 of the last pass."""
        return self._sampled(n, start)

    def logits_rows(self, start: int, n: int) -> np.ndarray:
        """The logits of batch rows start..start+n-1 of the last pass: a view where llama.cpp stored them one after
        another (valid until the next pass), else a copy."""
        handle, width = self.handle, self.n_vocab * 4
        first = ctypes.cast(llama_cpp.llama_get_logits_ith(handle, start), ctypes.c_void_p).value
        last = ctypes.cast(llama_cpp.llama_get_logits_ith(handle, start + n - 1), ctypes.c_void_p).value
        if not first or not last:
            raise RuntimeError(f"llama.cpp kept no logits for batch rows {start}..{start + n - 1}")
        if last - first == (n - 1) * width:
            return self._view(first, n)
        rows = [ctypes.cast(llama_cpp.llama_get_logits_ith(handle, start + i), ctypes.c_void_p).value
                for i in range(n)]
        return np.stack([self._view(address, 1)[0] for address in rows if address])

    def seq_drop(self, seq: int, n_keep: int) -> None:
        """Drop sequence ``seq``'s positions >= n_keep (every other sequence keeps its cells), and check it."""
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, n_keep, -1):
            raise RollbackUnsupported(f"{self.model.path.name} cannot drop cached positions (recurrent model?)")
        pos_max = llama_cpp.llama_memory_seq_pos_max(self._memory, seq)
        if pos_max != n_keep - 1:
            raise RollbackUnsupported(f"rollback left position {pos_max} in the cache, expected {n_keep - 1}")

    def seq_share(self, src: int, dst: int, n: int) -> None:
        """Give sequence ``dst`` the cells of ``src``'s first ``n`` positions (shared, not copied: a unified cache)."""
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, 0, n)

    def feed(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the cache without computing any output (a prompt, a rebuilt history)."""
        self._run(tokens, all_outputs=False, last_output=False)

    def _run(self, tokens: Sequence[int], *, all_outputs: bool, last_output: bool = True) -> None:
        n = len(tokens)
        if n == 0:
            raise ValueError("decode() needs at least one token")
        self._check_room(n)
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            m = len(chunk)
            self._tok[:m] = chunk
            self._pos[:m] = np.arange(self.n_past, self.n_past + m, dtype=np.int32)
            self._want[:m] = 1 if all_outputs else 0
            if last_output and start + m == n:
                self._want[m - 1] = 1
            self._decode_batch(m)
            self.tokens.extend(chunk)

    def _check_room(self, n: int) -> None:
        """Before a pass of ``n`` tokens: decoded from the usual thread, and they fit in the context."""
        if self._thread != threading.get_ident():
            self._check_thread()
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(
                f"context full: {self.n_past + n} tokens do not fit in --ctx {self.n_ctx} "
                "(raise --ctx or shorten the prompt)"
            )

    def _decode_batch(self, n: int) -> None:
        """llama_decode the batch's first ``n`` tokens."""
        self._batch.n_tokens = n
        rc = llama_cpp.llama_decode(self.handle, self._batch)
        if rc == 1:
            raise ContextFullError("llama.cpp found no room in the KV cache: raise --ctx")
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def _attach(self) -> None:
        for s in range(self.n_seq):
            self.set_backend_greedy(s, True)

    def _detach(self) -> None:
        for s in list(self._chains):
            self.set_backend_greedy(s, False)

    def use_backend_sampler(self, on: bool) -> None:
        """Read greedy passes back as the backend sampler's token ids (on, where it can), or as logits argmax'd
        here (off): for where the sampler costs more than the copy it saves (speculative/calibrate.py,
        choose_reads)."""
        self.backend_sampling = on and self.can_sample
        if not self.backend_sampling:
            self._detach()

    def set_backend_greedy(self, seq: int, on: bool) -> None:
        """Whether sequence ``seq``'s rows come back as backend-sampled token ids (on) or as logits (off). Each switch
        makes llama.cpp re-reserve its graph on the next pass."""
        if on == (seq in self._chains):
            return
        if on:
            chain = greedy_chain()
            if not llama_cpp.llama_set_sampler(self.handle, seq, chain):
                llama_cpp.llama_sampler_free(chain)
                raise RuntimeError("llama.cpp refused the backend greedy sampler it accepted before")
            self._chains[seq] = chain
        else:
            llama_cpp.llama_set_sampler(self.handle, seq, None)
            # llama.cpp drops every graph built with the old chain before its next pass: freeing it now is safe
            llama_cpp.llama_sampler_free(self._chains.pop(seq))

    def _free_chains(self) -> None:
        for chain in self._chains.values():
            llama_cpp.llama_sampler_free(chain)
        self._chains = {}

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
                stacklevel=4,
            )
        self._thread = me

    def _logits(self, rows: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self.handle)
        return self._view(ctypes.cast(ptr, ctypes.c_void_p).value, rows)

    def _view(self, address: int | None, rows: int) -> np.ndarray:
        array_type = self._logit_types.get(rows)
        if array_type is None:
            array_type = self._logit_types[rows] = ctypes.c_float * (rows * self.n_vocab)
        return np.frombuffer(array_type.from_address(address), dtype=np.float32).reshape(rows, self.n_vocab)

    def truncate(self, n_keep: int) -> None:
        """Drop every position >= n_keep from the cache, and check that it happened."""
        # nothing to drop: a draft model that has not drafted yet is truncated to nothing after every step, and a
        # clear (llama_memory_clear zeroes the whole KV buffer) cost the Qwen2.5-Coder 0.5B's 2.7 ms a step, 3% of its
        # target's plain pass on a 2-core CPU
        if n_keep >= self.n_past:
            return
        if n_keep == 0:
            self.clear()  # every sequence, a tree's branches too
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
            self._free_chains()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
