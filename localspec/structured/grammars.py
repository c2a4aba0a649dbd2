"""A model's grammars: llguidance's tokenizer, built once from the model's vocabulary, and each request's
``Constraint`` from its spec.

Building the tokenizer takes every token's bytes (read through llama.cpp once per model, then from a file:
structured/pieces.py) and llguidance's own tables (~1.5 s for a 262k vocabulary), so it waits for the first
constrained request, and the model keeps it: it calls back into the model's vocabulary, so it must
not outlive the model (one ``Grammars`` per open model, dropped with it).

A request's matcher is compiled at admission (``compile``), with the tokenizer and under ``LIMITS``, in the
admitting thread (a server's worker thread pool, never its event loop): whatever a grammar can get wrong (a special
token the vocabulary lacks, a token id past it, a lexer that would not finish) is the request's 400 there, and the
pass loop only copies a matcher that already worked (docs/architecture.md, "Requests that cannot hurt each other").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp
import numpy as np

from localspec.errors import STOPPING
from localspec.schema.cache import BoundedCache
from localspec.schema.json_style import DEFAULT, Separators
from localspec.schema.spec import TOOL_CALLS, ConstraintError, ConstraintSpec
from localspec.structured.constraint import Constraint, SpecMemo
from localspec.structured.pieces import pieces

# llguidance's bounds on what one grammar may cost (its LLParserLimits): the grammar's size, the lexer's work to
# build its first state and a step's, and the lexer states it may keep (each ~1-2 kB, for the matcher's life).
# Each is above what any schema, tool list or grammar of docs/structured.md's needs, and bounds a hostile one.
LIMITS = {"max_grammar_size": 500_000, "initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000,
          "max_lexer_states": 20_000}
MATCHERS_KEPT = 64  # compiled matchers kept, one per spec: a new request copies its own from one
# and their memory, estimated: llguidance does not say what a matcher holds, which grows with its grammar (its
# lexer's states, up to LIMITS' 20,000, are built from the grammar's regexes as they are reached): a base and
# MATCHER_BYTES_PER_GRAMMAR_BYTE for each byte of the compiled grammar
MATCHERS_BYTES = 256 * 1024 * 1024
MATCHER_BASE_BYTES = 256 * 1024
MATCHER_BYTES_PER_GRAMMAR_BYTE = 64

if TYPE_CHECKING:
    from localspec.engine.vocab import Vocab


class Grammars:
    """Constraints for one model's vocabulary; ``say``: told once, when the tokenizer is built (it takes seconds);
    ``model``: the GGUF the vocabulary came from, whose pieces are kept on disk (structured/pieces.py)."""

    def __init__(self, vocab: Vocab, say: Callable[[str], None] | None = None, model: Path | None = None) -> None:
        self.vocab = vocab
        self.model = model
        self.say = say
        self._tokenizer: object | None = None
        self._tokenizer_lock = threading.Lock()
        self._eog: frozenset[int] = frozenset()
        self._closers = np.zeros(0, dtype=np.int64)  # the tokens that shut a JSON answer (Constraint._close)
        # per spec, a compiled matcher, never advanced (each generation gets its own copy), and what the generations
        # under it share (SpecMemo: forced tokens, the first allowed ids), kept and dropped together
        self._compiled: BoundedCache[ConstraintSpec, tuple[object, SpecMemo]] = BoundedCache(
            MATCHERS_KEPT, MATCHERS_BYTES, _matcher_bytes)
        # the checker's (``matches``: tools' schemas as written) apart, so that reading calls back never evicts what
        # requests' admissions compiled
        self._checking: BoundedCache[ConstraintSpec, tuple[object, SpecMemo]] = BoundedCache(
            MATCHERS_KEPT, MATCHERS_BYTES // 4, _matcher_bytes)
        self.tokenizer_seconds = 0.0

    def prepare(self) -> None:
        """Build the tokenizer now (seconds), not at the first constrained request: a server's first such client
        would wait for it."""
        self._tokenizer_built()

    def compile(self, spec: ConstraintSpec) -> object:
        """The spec's matcher with this model's tokenizer, compiled once (thread-safe; a request's admission calls
        it); ConstraintError, naming the spec, where it cannot be used with this model or passes ``LIMITS``."""
        return self._entry(spec)[0]

    def memo(self, spec: ConstraintSpec) -> SpecMemo:
        """What the generations under ``spec`` share beside its matcher (compiled if it is not yet)."""
        return self._entry(spec)[1]

    def _cache(self, spec: ConstraintSpec) -> BoundedCache[ConstraintSpec, tuple[object, SpecMemo]]:
        return self._checking if spec.as_written else self._compiled

    def _entry(self, spec: ConstraintSpec) -> tuple[object, SpecMemo]:
        entry = self._cache(spec).get(spec)
        if entry is not None:
            return entry
        from llguidance import LLMatcher, LLParserLimits

        grammar = spec.grammar()
        tokenizer = self._tokenizer_built()
        try:
            matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=LLParserLimits(**LIMITS))
            error = matcher.get_error() if matcher.is_error() else ""
            if not error:  # the first mask: a lexer that cannot finish it fails here, not in a shared pass
                matcher.compute_bitmask()
                error = matcher.get_error() if matcher.is_error() else ""
        except STOPPING:
            raise
        except BaseException as e:  # llguidance's Rust panics are pyo3's PanicException, a BaseException
            error = f"{type(e).__name__}: {e}"
        if error:  # llguidance lists every special token after an unknown one: the first words say enough
            error = " ".join(str(error).split("; following special tokens")[0].split())[:400]
            raise ConstraintError(f"the {spec.describe()} cannot be used with this model: {error}")
        entry = (matcher, SpecMemo())
        self._cache(spec).put(spec, entry)
        return entry

    def start(self, spec: ConstraintSpec, compiled: object | None = None) -> Constraint:
        """A fresh constraint for one generation, copied from ``compiled`` (what its admission compiled), else
        compiled now; ConstraintError where the spec cannot be used with this model."""
        entry = self._entry(spec) if compiled is None else self._cache(spec).get(spec)
        if entry is None or (compiled is not None and entry[0] is not compiled):
            # the memo goes with its matcher: one its admission compiled before the spec was dropped gets its own
            entry = (compiled, SpecMemo())
        pristine, memo = entry
        return Constraint(pristine.deep_copy(), self._eog, self.vocab.n_tokens, spec.triggers, self.vocab.piece,
                          self._closers, memo, self._retokenize, ends_when_left=spec.name == TOOL_CALLS)

    def _retokenize(self, data: bytes) -> list[int]:
        """Tokens of ``data`` (a trigger's bytes, fed to its grammar: structured/constraint.py), specials included."""
        return self.vocab.tokenize(data.decode("utf-8", "replace"), add_special=False, parse_special=True)

    def matches(self, schema: Mapping[str, Any], value: Any, separators: Separators = DEFAULT) -> bool:
        """Whether ``value`` (parsed JSON) is valid under ``schema``: written as the grammar writes JSON (with
        ``separators``, the answer's; properties in the schema's order) and run through it. False, never an
        error, for a value that cannot be written (a lone surrogate is no UTF-8)."""
        try:
            # the schema as written: a call read back from free text need not keep the bounds a grammar writes under
            spec = ConstraintSpec.json_schema(schema, separators=separators, as_written=True)
            matcher = self.start(spec).matcher  # compiled once a schema
        except ConstraintError:
            return False
        try:
            text = json.dumps(_in_order(value, schema), ensure_ascii=False, separators=separators)
            tokens = self.vocab.tokenize(text, add_special=False, parse_special=False)
        except ValueError:  # UnicodeEncodeError among them
            return False
        return bool(matcher.consume_tokens(tokens) and matcher.is_accepting())

    def _tokenizer_built(self) -> object:
        with self._tokenizer_lock:  # two first requests at once build it once
            if self._tokenizer is None:
                t0 = time.perf_counter()
                self._tokenizer, self._eog, self._closers = _tokenizer(self.vocab, self.model)
                self.tokenizer_seconds = time.perf_counter() - t0
                if self.say is not None:
                    self.say(f"structured output: read the model's {self.vocab.n_tokens:,}-token vocabulary for "
                             f"the grammar in {self.tokenizer_seconds:.1f} s (once per model)")
        return self._tokenizer


def _tokenizer(vocab: Vocab, model: Path | None) -> tuple[object, frozenset[int], np.ndarray]:
    """llguidance's tokenizer over llama.cpp's vocabulary (as llguidance.llamacpp builds it, with the attribute
    call llama.cpp has not deprecated), the tokens that end a generation: every one of them ends a constrained
    answer (Gemma's <end_of_turn> as well as its EOS), and the tokens that shut JSON: those made only of quotes,
    braces and brackets, and the commas (Constraint._close picks among those allowed)."""
    import ctypes

    from llguidance import LLTokenizer

    read = pieces(vocab, model)
    tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    ends = read.eog or [vocab.eos]
    closers = np.array([t for t, p in enumerate(read.pieces) if (p and not p.strip(b'"}]')) or p in (b",", b", ")],
                       dtype=np.int64)
    return LLTokenizer.from_llamacpp(tokens=read.pieces, vocab_ptr=vocab.handle, tokenize_fptr=tokenize,
                                     eos_token=ends, slices=None), frozenset(ends), closers


def _in_order(value: Any, schema: Any) -> Any:
    """``value`` with each object's keys in its schema's ``properties`` order (the grammar writes them so)."""
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        known = [k for k in props if k in value]
        return {k: _in_order(value[k], props.get(k)) for k in [*known, *(k for k in value if k not in props)]}
    if isinstance(value, list):
        return [_in_order(v, schema.get("items")) for v in value]
    return value


def _matcher_bytes(spec: ConstraintSpec, entry: tuple[object, SpecMemo]) -> int:
    """A compiled matcher's memory, estimated from its grammar's size (``MATCHERS_BYTES``)."""
    return MATCHER_BASE_BYTES + MATCHER_BYTES_PER_GRAMMAR_BYTE * len(spec.grammar())
