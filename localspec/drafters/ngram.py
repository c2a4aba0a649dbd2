"""Prompt-lookup drafting: continue the text the way it continued the last time its suffix appeared.

The index maps every n-gram (n = 1..max_n) of the history to the position right after its most recent
occurrence; it grows by max_n dictionary writes per accepted token, so a step costs the same on a 32k-token
context as on a short one. Two refinements over plain lookup:

- **follow**: once a draft copied from some place was accepted in full (bonus token included), keep copying
  from that same place rather than re-looking the suffix up: when the model is reproducing a passage, the most
  recent occurrence of a short suffix is often somewhere else (its own output), while the passage goes on.
- **kinds**: the draft says what it is based on ("ngram/follow", "ngram/3", ...) so the draft-length policy learns
  separately how far each kind of match deserves to be trusted.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.drafters.base import Draft


class NgramDrafter:
    name = "ngram"
    lookup = True

    def __init__(self, max_n: int = 8, min_n: int = 1) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self._tokens: list[int] = []
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self._source: int | None = None  # where the last draft was copied from
        self._follow: int | None = None  # where to keep copying from, after a fully accepted draft

    def begin(self, history: Sequence[int]) -> None:
        if not self._extends(history):
            self._tokens = []
            self._index = [{} for _ in range(self.max_n + 1)]
        self._follow = self._source = None
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

    def _lookup(self) -> tuple[int, int] | None:
        tokens = self._tokens
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            start = self._index[n].get(tuple(tokens[-n:]))
            if start is not None:
                return start, n
        return None

    def propose(self, history: Sequence[int], cap: int) -> Draft:
        self._extend(history)
        tokens = self._tokens
        self._source = None
        if cap <= 0:
            return Draft(drafter=self.name)
        if self._follow is not None and self._follow < len(tokens):
            start, kind = self._follow, f"{self.name}/follow"
        else:
            found = self._lookup()
            if found is None:
                return Draft(drafter=self.name)
            start, n = found
            kind = f"{self.name}/{min(n, 4)}{'+' if n >= 4 else ''}"
        draft = tokens[start : start + cap]
        self._source = start
        return Draft(draft, None, self.name, kind)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        self._extend(history)
        source, self._follow = self._source, None
        if source is None:
            return
        # the step's tokens (accepted draft, then the target's own) all continue the source: keep following it.
        # Compare them all: under `auto` the accepted tokens may have come from another drafter.
        n = n_accepted + 1
        nxt = source + n
        if nxt < len(self._tokens) and self._tokens[source:nxt] == self._tokens[-n:]:
            self._follow = nxt

    def close(self) -> None:
        self._tokens = []
