"""A separate (smaller) GGUF model as the drafter, with its own context kept in step with the target.

The draft context holds the accepted history plus the drafted tokens it decoded; after each step it is rolled
back to the accepted prefix, and only the tokens it has not seen (the target's correction, or a fully accepted
draft's last token) are decoded before the next draft — the prompt is prefilled once, never per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters.base import Draft
from localspec.engine import Context, Model
from localspec.errors import UserError
from localspec.sampling import Distribution, pick
from localspec.settings import SamplingSettings
from localspec.tokens import backlog, common_prefix


class ModelDrafter:
    lookup = False

    def __init__(
        self,
        context: Context,
        sampling: SamplingSettings,
        rng: np.random.Generator,
        *,
        name: str = "draft",
        p_min: float = 0.0,
        owns_model: bool = True,
    ) -> None:
        self.name = name
        self._ctx = context
        self._sampling = sampling
        self._rng = rng
        self._p_min = p_min
        self._owns_model = owns_model

    def begin(self, history: Sequence[int]) -> None:
        self._ctx.truncate(common_prefix(self._ctx.tokens, history[:-1]))

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        if cap <= 0:
            return Draft(drafter=self.name, kind=self.name)
        row = self._ctx.decode(backlog(self._ctx, history))[-1]  # the history tokens it has not seen
        tokens: list[int] = []
        dists: list[Distribution] | None = None if self._sampling.greedy else []
        while True:
            picked = pick(row, self._sampling, self._rng, self._p_min)
            if picked is None:
                break
            token, q = picked
            tokens.append(token)
            if dists is not None and q is not None:
                dists.append(q)
            if len(tokens) == cap:
                break
            row = self._ctx.decode([token])[-1]
        return Draft(tokens, dists, self.name, self.name)

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        # The context holds the old history plus some drafted tokens; of those, the accepted ones agree with the
        # new history up to (but excluding) its last token, the target's own. Drop the rest now.
        self._ctx.truncate(min(len(self._ctx.tokens), len(history) - 1))

    def close(self) -> None:
        model = self._ctx.model
        self._ctx.close()
        if self._owns_model:
            model.close()


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose tokenizer differs from the target's: its token ids would mean other text."""
    tv, dv = target.vocab, draft.vocab
    problems: list[str] = []
    # a few padding tokens at the end are common between sizes of one family; ids below must still agree
    if abs(tv.n_tokens - dv.n_tokens) > 128:
        problems.append(f"vocabulary sizes {tv.n_tokens} vs {dv.n_tokens}")
    for what, a, b in (("BOS", tv.bos, dv.bos), ("EOS", tv.eos, dv.eos), ("add-BOS", tv.add_bos, dv.add_bos)):
        if a != b:
            problems.append(f"{what} {a} vs {b}")
    n = min(tv.n_tokens, dv.n_tokens)
    for token in sorted({*range(0, min(n, 300)), *range(0, n, max(1, n // 997))}):
        if tv.token_text(token) != dv.token_text(token):
            problems.append(f"token {token} is {tv.token_text(token)!r} vs {dv.token_text(token)!r}")
            break
    if problems:
        raise UserError(
            f"draft model {draft.path.name} does not share {target.path.name}'s tokenizer ("
            + "; ".join(problems)
            + "): pick a draft from the same model family (see `localspec models`)"
        )
