"""Token trees: several candidate continuations, merged on their shared prefixes, verified in one target pass.

A lookup drafter often has more than one plausible source after a short match (every field of an extraction
follows ``": "``). Verifying two or three short candidates costs little more than one long one where a pass of 8
tokens costs not much more than a pass of 1 (an H100: 1.9x). The candidates are merged into a trie: node i holds one
token and its parent (-1: the pending token, the root of every pass). Nodes are stored parents first, the first
candidate's nodes first, so a tree of one candidate is exactly today's chain, and node i is row i + 1 of the pass.

The target scores every node in one batch (the engine gives each branch its own sequence, so a node attends only
to its ancestors). Walking down from the root, the target's token at a node (its argmax, or its sampled token)
picks the child to follow; the walk stops where no child holds that token, and that token is the step's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenTree:
    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()  # the parent node of each node; -1 for the pending token
    _children: dict[tuple[int, int], int] = field(default_factory=dict, compare=False, repr=False)
    _leaves: tuple[int, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, candidates: Sequence[Sequence[int]]) -> TokenTree:
        """The trie of ``candidates`` (best first); duplicates and prefixes of earlier candidates add nothing."""
        if len(candidates) == 1:  # every step without a tree: a chain needs no trie
            chain = tuple(candidates[0])
            n = len(chain)
            children = {(i - 1, token): i for i, token in enumerate(chain)}
            return cls(chain, tuple(range(-1, n - 1)), children, (n - 1,) if n else ())
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[tuple[int, int], int] = {}
        for candidate in candidates:
            node = -1
            for token in candidate:
                child = children.get((node, token))
                if child is None:
                    child = children[(node, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                node = child
        has_child = set(parents)
        leaves = tuple(i for i in range(len(tokens)) if i not in has_child)
        return cls(tuple(tokens), tuple(parents), children, leaves)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def branches(self) -> int:
        """Root-to-leaf paths; 1 for a chain (and for an empty tree: the plain pass)."""
        return max(1, len(self._leaves))

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node`` (empty for the root, -1)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def walk(self, target_token: Callable[[int, int], int]) -> tuple[list[int], int]:
        """Follow the target down the tree: ``target_token(row, depth)`` is the target's token after the pass's
        row (0: the pending token; node i: row i + 1) at that depth. Returns the accepted nodes and the token the
        target adds after them (its correction where the walk left the tree, a bonus at a leaf)."""
        accepted: list[int] = []
        node = -1
        while True:
            token = target_token(node + 1, len(accepted))
            child = self._children.get((node, token))
            if child is None:
                return accepted, token
            accepted.append(child)
            node = child

    def rejected(self, accepted: Sequence[int]) -> tuple[list[int], list[list[int]]]:
        """The nodes off the accepted path: the rest of the branch that held it (the first branch when nothing was
        accepted), and the other branches' nodes, a run per branch, each node once (what a display shows)."""
        if len(self._leaves) == 1:  # a chain (one leaf: node i is at depth i): the rest of it
            return list(range(len(accepted), len(self.tokens))), []
        on_path = set(accepted)
        leaves = list(self._leaves)
        if accepted:
            leaves.sort(key=lambda leaf: accepted[-1] not in self.path(leaf))
        runs: list[list[int]] = []
        seen: set[int] = set(on_path)
        for leaf in leaves:
            run = [n for n in self.path(leaf) if n not in seen]
            seen.update(run)
            runs.append(run)
        if not runs:
            return [], []
        return runs[0], [run for run in runs[1:] if run]


def trie_sizes(candidates: Sequence[Sequence[int]], depth: int) -> list[list[int]]:
    """``sizes[w - 1][k]``: the nodes of the tree of the first w candidates cut to depth k (k = 0..depth).

    Candidate i adds the nodes below the longest prefix it shares with an earlier candidate: counted per candidate
    once, the table costs O(candidates × depth), cheap enough to weigh every shape each step."""
    sizes: list[list[int]] = []
    previous = [0] * (depth + 1)
    for i, candidate in enumerate(candidates):
        shared = 0
        for earlier in candidates[:i]:
            n = 0
            limit = min(len(earlier), len(candidate))
            while n < limit and earlier[n] == candidate[n]:
                n += 1
            shared = max(shared, n)
        row = [previous[k] + max(0, min(k, len(candidate)) - shared) for k in range(depth + 1)]
        sizes.append(row)
        previous = row
    return sizes
