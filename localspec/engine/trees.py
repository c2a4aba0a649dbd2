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
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from localspec.errors import RollbackUnsupported

if TYPE_CHECKING:  # the context calls these with itself; it imports this module
    from localspec.engine.context import Context


def decode_tree(ctx: Context, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
    """Score a token tree in one pass: ``tokens[0]`` follows the cache, ``tokens[i]`` follows row
    ``parents[i]`` (parents first). Returns a logits row per token (a view, valid until the next decode);
    the cache holds the whole tree until ``keep_path``."""
    if ctx._chains:
        ctx._detach()
    _run_tree(ctx, tokens, parents)
    return ctx._logits(len(tokens))

def decode_tree_argmax(ctx: Context, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
    """``decode_tree``, returning the argmax token id of each row (backend-sampled where available)."""
    if not ctx.backend_sampling:
        return decode_tree(ctx, tokens, parents).argmax(axis=1).tolist()
    if not ctx._chains:
        ctx._attach()
    _run_tree(ctx, tokens, parents)
    return ctx._sampled(len(tokens))

def _run_tree(ctx: Context, tokens: Sequence[int], parents: Sequence[int]) -> None:
    n = len(tokens)
    if n > ctx.max_rows:
        raise ValueError(f"a tree of {n} tokens: this context scores at most {ctx.max_rows} positions")
    depth, seqs = tree_sequences(parents)
    if len(seqs[0]) > ctx.n_seq:
        raise ValueError(f"a tree of {len(seqs[0])} branches: this context holds at most {ctx.n_seq}")
    ctx._check_room(n)
    for s in seqs[0][1:]:  # every branch sees the cached history
        llama_cpp.llama_memory_seq_cp(ctx._memory, 0, s, -1, -1)
    ctx._tok[:n] = tokens
    ctx._pos[:n] = np.asarray(depth, dtype=np.int32) + ctx.n_past
    ctx._want[:n] = 1
    for i, ids in enumerate(seqs):
        ctx._n_seq_id[i] = len(ids)
        row = ctx._batch.seq_id[i]
        for j, s in enumerate(ids):
            row[j] = s
    try:
        ctx._decode_batch(n)
    finally:
        ctx._n_seq_id[:n] = 1  # chain passes put every token in sequence 0 only
        for i in range(n):
            ctx._batch.seq_id[i][0] = 0
    ctx._tree = (list(tokens), seqs)

def keep_path(ctx: Context, rows: Sequence[int]) -> None:
    """After ``decode_tree``: keep the rows of one root-to-node path (row 0 first) as sequence 0, drop the rest."""
    if ctx._tree is None:
        raise RuntimeError("keep_path() without a tree pass")
    tokens, seqs = ctx._tree
    ctx._tree = None
    branch = seqs[rows[-1]][0]  # a branch through the path's last row holds the whole path
    n_keep = ctx.n_past + len(rows)
    memory = ctx._memory
    if not llama_cpp.llama_memory_seq_rm(memory, branch, n_keep, -1):
        raise RollbackUnsupported(f"{ctx.model.path.name} cannot drop cached positions (recurrent model?)")
    llama_cpp.llama_memory_seq_keep(memory, branch)
    if branch != 0:
        llama_cpp.llama_memory_seq_cp(memory, branch, 0, -1, -1)
        llama_cpp.llama_memory_seq_rm(memory, branch, -1, -1)
    pos_max = llama_cpp.llama_memory_seq_pos_max(memory, 0)
    if pos_max != n_keep - 1 or any(llama_cpp.llama_memory_seq_pos_max(memory, s) >= 0 for s in seqs[0][1:]):
        raise RollbackUnsupported(f"keeping a tree's path left position {pos_max}, expected {n_keep - 1}")
    ctx.tokens.extend(tokens[r] for r in rows)


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
