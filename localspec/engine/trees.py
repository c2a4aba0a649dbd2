"""Token trees on a context: score a tree's nodes in one pass, then keep one root-to-node path.

Token trees (``n_seq`` > 1): ``decode_tree`` scores a tree's nodes in one pass. Each root-to-leaf branch is a
llama.cpp sequence in a unified KV cache: the cached history is shared with every branch (``seq_cp``), and a node
carries the seq ids of every branch through it, so llama.cpp's mask lets it attend to its ancestors only.
``keep_path`` then keeps one path and hands it back to sequence 0 (``seq_rm`` / ``seq_keep`` / ``seq_cp``).
What llama.cpp requires of such a batch (llama-batch.cpp, llama-context.cpp): each sequence's positions continue its
cached ones (hence the ``seq_cp`` of the history first) and increase in batch order (parents first); the mask and
the backend sampler go by a token's *first* seq id (every ancestor carries it), raw logits are copied if any of a
token's seq ids lacks a sampler (hence a greedy chain on every sequence), and ``n_outputs_max_per_seq`` counts a
token once per seq id it carries.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np

from localspec.engine.model import Model
from localspec.errors import RollbackUnsupported


class TreePasses:
    """Token-tree passes, mixed into ``engine.context.Context``: it provides the batch (numpy views over one
    ``llama_batch``), the memory, the backend sampler and the bookkeeping declared here; these methods use them.
    (A mixin, not functions over a Context: this module then never imports the context, and no import circles.)"""

    model: Model
    tokens: list[int]
    n_seq: int
    max_rows: int
    backend_sampling: bool
    _memory: llama_cpp.llama_memory_t
    _batch: llama_cpp.llama_batch
    _tok: np.ndarray
    _pos: np.ndarray
    _want: np.ndarray
    _n_seq_id: np.ndarray
    _chains: dict[int, llama_cpp.llama_sampler_p]
    _tree: tuple[list[int], list[list[int]]] | None  # a tree pass's rows and the sequences each belongs to

    @property
    def n_past(self) -> int:
        raise NotImplementedError

    def _check_room(self, n: int) -> None:
        raise NotImplementedError

    def _decode_batch(self, n: int) -> None:
        raise NotImplementedError

    def _attach(self) -> None:
        raise NotImplementedError

    def _detach(self) -> None:
        raise NotImplementedError

    def _logits(self, rows: int) -> np.ndarray:
        raise NotImplementedError

    def _sampled(self, n: int, start: int = 0) -> list[int]:
        raise NotImplementedError

    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Score a token tree in one pass: ``tokens[0]`` follows the cache, ``tokens[i]`` follows row
        ``parents[i]`` (parents first). Returns a logits row per token (a view, valid until the next decode);
        the cache holds the whole tree until ``keep_path``."""
        if self._chains:
            self._detach()
        self._run_tree(tokens, parents)
        return self._logits(len(tokens))

    def decode_tree_argmax(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
        """``decode_tree``, returning the argmax token id of each row (backend-sampled where available)."""
        if not self.backend_sampling:
            return self.decode_tree(tokens, parents).argmax(axis=1).tolist()
        if not self._chains:
            self._attach()
        self._run_tree(tokens, parents)
        return self._sampled(len(tokens))

    def _run_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        n = len(tokens)
        if n > self.max_rows:
            raise ValueError(f"a tree of {n} tokens: this context scores at most {self.max_rows} positions")
        depth, seqs = tree_sequences(parents)
        if len(seqs[0]) > self.n_seq:
            raise ValueError(f"a tree of {len(seqs[0])} branches: this context holds at most {self.n_seq}")
        self._check_room(n)
        for s in seqs[0][1:]:  # every branch sees the cached history
            llama_cpp.llama_memory_seq_cp(self._memory, 0, s, -1, -1)
        self._tok[:n] = tokens
        self._pos[:n] = np.asarray(depth, dtype=np.int32) + self.n_past
        self._want[:n] = 1
        for i, ids in enumerate(seqs):
            self._n_seq_id[i] = len(ids)
            row = self._batch.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
        try:
            self._decode_batch(n)
        finally:
            self._n_seq_id[:n] = 1  # chain passes put every token in sequence 0 only
            for i in range(n):
                self._batch.seq_id[i][0] = 0
        self._tree = (list(tokens), seqs)

    def keep_path(self, rows: Sequence[int]) -> None:
        """After ``decode_tree``: keep the rows of one root-to-node path (row 0 first) as sequence 0, drop the rest."""
        if self._tree is None:
            raise RuntimeError("keep_path() without a tree pass")
        tokens, seqs = self._tree
        self._tree = None
        branch = seqs[rows[-1]][0]  # a branch through the path's last row holds the whole path
        n_keep = self.n_past + len(rows)
        memory = self._memory
        if not llama_cpp.llama_memory_seq_rm(memory, branch, n_keep, -1):
            raise RollbackUnsupported(f"{self.model.path.name} cannot drop cached positions (recurrent model?)")
        llama_cpp.llama_memory_seq_keep(memory, branch)
        if branch != 0:
            llama_cpp.llama_memory_seq_cp(memory, branch, 0, -1, -1)
            llama_cpp.llama_memory_seq_rm(memory, branch, -1, -1)
        pos_max = llama_cpp.llama_memory_seq_pos_max(memory, 0)
        if pos_max != n_keep - 1 or any(llama_cpp.llama_memory_seq_pos_max(memory, s) >= 0 for s in seqs[0][1:]):
            raise RollbackUnsupported(f"keeping a tree's path left position {pos_max}, expected {n_keep - 1}")
        self.tokens.extend(tokens[r] for r in rows)


def tree_sequences(parents: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Each row's depth, and the sequences it belongs to: branch b (the b-th leaf in row order) is sequence b."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        if not 0 <= parents[i] < i:
            raise ValueError(f"tree row {i} follows row {parents[i]}: parents must come first")
        depth[i] = depth[parents[i]] + 1
    has_child = set(parents)
    seqs: list[list[int]] = [[] for _ in range(n)]
    for b, leaf in enumerate(i for i in range(n) if i not in has_child):
        row = leaf
        while row >= 0:
            seqs[row].append(b)
            row = parents[row]
    return depth, seqs
