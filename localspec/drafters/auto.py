"""Per step, the cheapest drafter with something to say: n-gram lookup when the suffix has a match, else the
draft model if one is configured, else nothing (a plain decoding step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

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
        # n-gram first; a match the chooser trims to nothing leaves the step to the draft model
        draft = draft_for(self._ngram, history, k, self._chooser)
        if not draft.tokens and self._model is not None:
            draft = draft_for(self._model, history, k, self._chooser)
        return replace(draft, sized=True)  # already sized for its kind: the loop must not trim it again

    def accept(self, history: Sequence[int], n_accepted: int) -> None:
        self._ngram.accept(history, n_accepted)
        if self._model is not None:
            self._model.accept(history, n_accepted)

    def close(self) -> None:
        self._ngram.close()
        if self._model is not None:
            self._model.close()
