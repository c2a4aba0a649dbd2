"""A model's grammars: llguidance's tokenizer, built once from the model's vocabulary, and each request's
``Constraint`` from its spec.

Building the tokenizer reads every token's bytes through llama.cpp (1.6-1.9 s for a 262k vocabulary), so it waits
for the first constrained request, and the model keeps it: it calls back into the model's vocabulary, so it must
not outlive the model (one ``Grammars`` per open model, dropped with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import llama_cpp

from localspec.structured.constraint import Constraint
from localspec.structured.spec import ConstraintError, ConstraintSpec

if TYPE_CHECKING:
    from localspec.engine.vocab import Vocab


class Grammars:
    """Constraints for one model's vocabulary; ``say``: told once, when the tokenizer is built (it takes seconds)."""

    def __init__(self, vocab: Vocab, say: Callable[[str], None] | None = None) -> None:
        self.vocab = vocab
        self.say = say
        self._tokenizer: object | None = None
        self._eog: frozenset[int] = frozenset()
        self._matchers: dict[ConstraintSpec, object] = {}  # a compiled matcher per spec, copied for each request
        self.tokenizer_seconds = 0.0

    def start(self, spec: ConstraintSpec) -> Constraint:
        """A fresh constraint for one generation; ConstraintError where the spec cannot be used with this model."""
        from llguidance import LLMatcher

        tokenizer = self._tokenizer_built()
        pristine = self._matchers.get(spec)
        if pristine is None:
            matcher = LLMatcher(tokenizer, spec.grammar(), log_level=0)
            if matcher.is_error():
                raise ConstraintError(f"the {spec.describe()} cannot be used: {matcher.get_error()}")
            if len(self._matchers) >= 64:
                self._matchers.pop(next(iter(self._matchers)))
            pristine = self._matchers[spec] = matcher
        return Constraint(pristine.deep_copy(), self._eog, self.vocab.n_tokens)

    def _tokenizer_built(self) -> object:
        if self._tokenizer is None:
            from llguidance.llamacpp import lltokenizer_from_vocab

            t0 = time.perf_counter()
            handle = self.vocab.handle
            n = self.vocab.n_tokens
            # every end-of-generation token ends a constrained answer (Gemma's <end_of_turn> as well as its EOS)
            self._eog = frozenset(t for t in range(n) if llama_cpp.llama_vocab_is_eog(handle, t))
            self._tokenizer = lltokenizer_from_vocab(handle, eos_token=sorted(self._eog) or [self.vocab.eos])
            self.tokenizer_seconds = time.perf_counter() - t0
            if self.say is not None:
                self.say(f"structured output: read the model's {n:,}-token vocabulary for the grammar in "
                         f"{self.tokenizer_seconds:.1f} s (once per model)")
        return self._tokenizer
