"""Prompt-lookup drafting: continue the text the way it continued the last time its suffix appeared.

The index maps every n-gram (n = 1..max_n) of the history to the position right after its most recent
occurrence; it grows by max_n dictionary writes per accepted token, so a step costs the same on a 32k-token
context as on a short one. Longer suffix matches are tried first: they predict better, and the draft's
``key`` carries the match length so the adaptive chooser can learn how far to trust each.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.drafters.base import Draft


class NgramDrafter:
    name = "ngram"
    cheap = True

    def __init__(self, max_n: int = 6, min_n: int = 1) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self._tokens: list[int] = []
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]

    def begin(self, history: Sequence[int]) -> None:
        if not self._extends(history):
            self._tokens = []
            self._index = [{} for _ in range(self.max_n + 1)]
        self._extend(history)

    def _extends(self, history: Sequence[int]) -> bool:
        n = len(self._tokens)
        if n > len(history):
            return False
        # a sample of positions (ends and middle) is enough: histories here only ever grow at the tail
        probe = {0, n // 2, n - 1} if n else set()
        return all(history[i] == self._tokens[i] for i in probe)

    def _extend(self, history: Sequence[int]) -> None:
        tokens = self._tokens
        for j in range(len(tokens), len(history)):
            tokens.append(history[j])
            # register the n-grams that end just before j: their continuation starts at j
            for n in range(1, min(self.max_n, j) + 1):
                self._index[n][tuple(tokens[j - n : j])] = j

    def propose(self, history: Sequence[int], k: int) -> Draft:
        self._extend(history)
        tokens = self._tokens
        if k <= 0:
            return Draft(drafter=self.name)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            start = self._index[n].get(tuple(tokens[-n:]))
            if start is not None:
                return Draft(tokens[start : start + k], None, self.name, f"{self.name}/{n}")
        return Draft(drafter=self.name)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        self._extend(history)

    def close(self) -> None:
        self._tokens = []
