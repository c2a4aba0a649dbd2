"""A tiny numpy language model behind the engine's protocol: batch-invariant by construction.

Its logits depend only on the last two tokens, through fixed random tables, so a batch and one-at-a-time
decoding give bit-identical logits and the loop's logic can be checked exactly, token for token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

VOCAB = 48
EOS = 0


class ToyModel:
    def __init__(self, seed: int = 0, sharpness: float = 3.0, noise_from: ToyModel | None = None,
                 noise: float = 0.0) -> None:
        rng = np.random.default_rng(seed)
        if noise_from is None:
            self.a = rng.normal(size=(VOCAB, VOCAB)) * sharpness
            self.b = rng.normal(size=(VOCAB, VOCAB)) * sharpness * 0.5
        else:  # a "draft" that mostly agrees with another toy model
            self.a = noise_from.a + rng.normal(size=(VOCAB, VOCAB)) * noise
            self.b = noise_from.b + rng.normal(size=(VOCAB, VOCAB)) * noise
        self.a[:, EOS] -= 6.0  # end-of-generation is rare
        self.model = None  # what ModelDrafter.close() looks at

    def row(self, prev2: int, prev: int) -> np.ndarray:
        return (self.a[prev] + self.b[prev2]).astype(np.float32)

    # TokenInfo protocol
    def piece(self, token: int) -> bytes:
        return b"" if token == EOS else f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS


class ToyContext:
    """The Target protocol over a ToyModel; counts passes (and which kind) so tests can see what was asked."""

    def __init__(self, model: ToyModel, n_ctx: int = 4096) -> None:
        self.m = model
        self.model = None
        self.n_ctx = n_ctx
        self.tokens: list[int] = []
        self.scope: str | None = None  # as a lane's: whose text it holds (the scheduler sets it)
        self.passes = 0
        self.logit_passes = 0  # passes that returned logits (decode), not only token ids
        self.tree_passes = 0
        self._tree: tuple[list[int], list[int]] | None = None

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        self.logit_passes += 1
        out = self._pass(tokens)
        return out if all_logits else out[-1:]

    def decode_argmax(self, tokens: Sequence[int]) -> list[int]:
        return [int(row.argmax()) for row in self._pass(tokens)]

    def feed(self, tokens: Sequence[int]) -> None:
        self._pass(tokens)

    def decode_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        self.logit_passes += 1
        return self._tree_pass(tokens, parents)

    def decode_tree_argmax(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
        return [int(row.argmax()) for row in self._tree_pass(tokens, parents)]

    def _tree_pass(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Each row sees its own ancestors only: its parent's token, or the cache's last for the root."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise RuntimeError("toy context full")
        assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, len(tokens))), parents
        self.passes += 1
        self.tree_passes += 1
        self._tree = (list(tokens), list(parents))
        last = self.tokens[-1] if self.tokens else EOS
        return np.stack([self.m.row(tokens[parents[i]] if i else last, int(t)) for i, t in enumerate(tokens)])

    def keep_path(self, rows: Sequence[int]) -> None:
        assert self._tree is not None, "keep_path without a tree pass"
        tokens, parents = self._tree
        self._tree = None
        assert rows[0] == 0 and all(parents[b] == a for a, b in zip(rows, rows[1:])), f"not a path: {rows}"
        self.tokens.extend(tokens[r] for r in rows)

    def _pass(self, tokens: Sequence[int]) -> np.ndarray:
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise RuntimeError("toy context full")
        self.passes += 1
        rows = []
        for t in tokens:
            prev2 = self.tokens[-1] if self.tokens else EOS
            self.tokens.append(int(t))
            rows.append(self.m.row(prev2, int(t)))
        return np.stack(rows)

    def truncate(self, n_keep: int) -> None:
        del self.tokens[n_keep:]

    def close(self) -> None:
        pass


def plain_greedy(model: ToyModel, prompt: Sequence[int], n: int) -> list[int]:
    """Reference: one token at a time, argmax, stop at EOS."""
    tokens = list(prompt)
    out: list[int] = []
    while len(out) < n:
        prev2 = tokens[-2] if len(tokens) > 1 else EOS
        nxt = int(model.row(prev2, tokens[-1]).argmax())
        if nxt == EOS:
            break
        out.append(nxt)
        tokens.append(nxt)
    return out


class RecurrentToyContext(ToyContext):
    """A context whose memory, like a recurrent model's, can only be dropped whole."""

    def truncate(self, n_keep: int) -> None:
        from localspec.errors import RollbackUnsupported

        if 0 < n_keep < len(self.tokens):
            raise RollbackUnsupported("toy recurrent memory")
        super().truncate(n_keep)


class ToyLanes:
    """Lanes of toy contexts sharing passes, behind the scheduler's SharedContext protocol: logits depend only on a
    lane's own tokens, so a sequence's outputs cannot depend on its neighbours unless the scheduler mixes them up."""

    def __init__(self, model: ToyModel, n_lanes: int, n_ctx: int = 4096, n_batch: int = 512,
                 max_rows: int = 64) -> None:
        self.lanes = [ToyContext(model, n_ctx) for _ in range(n_lanes)]
        self.n_ctx, self.n_batch, self.max_rows = n_ctx, n_batch, max_rows
        self.passes = 0
        self.rows: list[int] = []  # outputs per pass
        self.shared = 0  # tokens copied between lanes

    def __len__(self) -> int:
        return len(self.lanes)

    def __getitem__(self, lane: int) -> ToyContext:
        return self.lanes[lane]

    def begin(self, lane: int, job: object) -> None:
        self.begun = getattr(self, "begun", 0) + 1

    def decode(self, parts: Sequence) -> list:
        assert sum(len(p.tokens) for p in parts) <= self.n_batch, "a pass over the batch size"
        outputs = sum(len(p.tokens) for p in parts if p.want)
        assert outputs <= self.max_rows, f"{outputs} outputs in a pass of at most {self.max_rows}"
        assert len({p.lane for p in parts}) == len(parts), "a lane twice in one pass"
        self.passes += 1
        self.rows.append(outputs)
        out = []
        for p in parts:
            rows = self.lanes[p.lane]._pass(p.tokens) if p.tokens else None
            self.lanes[p.lane].passes -= 1  # counted once, here
            if p.want is None:
                out.append(None)
            elif p.want == "ids":
                out.append([int(r.argmax()) for r in rows])
            else:
                out.append(rows)
        return out

    def share(self, src: int, dst: int, n: int) -> None:
        assert n <= len(self.lanes[src].tokens)
        self.lanes[dst].tokens = list(self.lanes[src].tokens[:n])
        self.shared += n
