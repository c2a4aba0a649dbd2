"""Per step, the cheapest drafter with something to say: n-gram lookup when the suffix has a match, else the
draft model if one is configured, else nothing (a plain decoding step)."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.drafters.base import Draft, Drafter
from localspec.drafters.ngram import NgramDrafter
from localspec.speculative.adaptive import AdaptiveK, draft_for


class AutoDrafter:
    name = "auto"
    cheap = True

    def __init__(self, chooser: AdaptiveK, model: Drafter | None = None) -> None:
        self._ngram = NgramDrafter()
        self._model = model
        self._chooser = chooser

    def begin(self, history: Sequence[int]) -> None:
        self._ngram.begin(history)
        if self._model is not None:
            self._model.begin(history)

    def propose(self, history: Sequence[int], k: int) -> Draft:
        draft = self._ngram.propose(history, k)
        if draft.tokens:
            # trim here: an n-gram draft the chooser cuts to nothing should leave room for the model
            draft = draft.trimmed(self._chooser.best_k(draft.key, draft.drafter, len(draft)))
            if draft.tokens or self._model is None:
                return Draft(draft.tokens, None, draft.drafter, draft.key, sized=True)
        if self._model is None:
            return draft
        sized = draft_for(self._model, history, k, self._chooser)
        return Draft(sized.tokens, sized.dists, sized.drafter, sized.key, sized=True)

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        self._ngram.accept(history, n_accepted)
        if self._model is not None:
            self._model.accept(history, n_accepted)

    def close(self) -> None:
        self._ngram.close()
        if self._model is not None:
            self._model.close()
