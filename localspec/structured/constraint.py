"""One generation's grammar state, as the speculation loop consults it (docs/architecture.md, "Constraints and real
pairs").

Between propose and verify the loop asks it for the tokens the grammar forces (drafts of their own kind, verified
like any other: a byte-level grammar may allow the same bytes tokenized another way) and cuts every draft at its
first token the grammar forbids, before it costs a row of the pass. In verify it picks each row's token:

- greedy: the constrained argmax equals the plain argmax wherever that token is allowed, so the target's own token
  is checked (about a microsecond) and a full mask is computed only for a row whose argmax is forbidden, which
  ends the draft's acceptance: at most one such row a pass;
- sampled: the distribution is the grammar's mask first, then top-k / top-p / min-p / temperature (llama.cpp's
  order), the same with or without drafts. With top-k on, the mask is read for the row's best candidates only; a
  full mask only where fewer than k of them are allowed.

The matcher consumes only what the step emits (accepted draft tokens and the target's own), so nothing consumed
speculatively is ever rolled back but the forced tokens that a proposal looked past.

A tool call may be shut before its tokens run out (``close_at``): from that position on, each row's token is the
end where the grammar may end, else the allowed token that closes the most of what is open (the string, then the
objects and lists, innermost first), else a comma, else the model's best allowed token (a value the grammar still
needs). It depends only on the position and the text, so drafts and target-only agree.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from localspec.drafters.base import FORCED, Draft, Verdict
from localspec.sampling import Distribution, shape, shape_candidates, top_k
from localspec.settings import SamplingSettings
from localspec.structured.call_shapes import ANCHORED, anchored_start

# the last tokens of a tool call's budget in which it is shut (``close_at``): enough for a string, two braces, the
# forced names of two missing required parameters with empty values, and the end
CLOSING_TOKENS = 16
# candidates whose mask bits are read before a sampled row falls back to the whole vocabulary's mask
_CANDIDATES_MIN = 256
# a mask with more non-zero 32-token words than this is expanded whole
_SPARSE_WORDS = 256
# forced byte strings whose tokens a spec keeps (``Constraint._forced``): a schema's keys and their separators, none
# longer than FORCED_BYTES_KEPT (a long literal forces a new suffix at every step: kept, they would grow as its square)
FORCED_KEPT = 1024
FORCED_BYTES_KEPT = 256
# where the mask allows many tokens, the next best checked on its bits before its ids are expanded
_NEXT_BEST = 3


@dataclass
class SpecMemo:
    """What holds for every generation under one spec, learned by the first that needed it: the tokens of each
    forced byte string (``Constraint._forced``), and the ids allowed first (where the model's own first token is
    forbidden: nearly every answer starts with a newline or a word before its brace)."""

    forced: dict[bytes, tuple[int, ...]] = field(default_factory=dict)
    first: np.ndarray | None = None


def closing_room(max_tokens: int) -> int:
    """How many of an answer's last tokens shut a tool call: CLOSING_TOKENS, half of a short budget."""
    return min(CLOSING_TOKENS, max(1, max_tokens // 2))


class Constraint:
    """``matcher``: a fresh llguidance LLMatcher for this generation; ``eog``: the tokens that end it;
    ``memo``: what its spec's generations share (``SpecMemo``)."""

    def __init__(self, matcher: object, eog: frozenset[int], n_vocab: int, triggers: tuple[str, ...] = (),
                 piece: Callable[[int], bytes] | None = None, closers: np.ndarray | None = None,
                 memo: SpecMemo | None = None, tokenize: Callable[[bytes], list[int]] | None = None,
                 ends_when_left: bool = False) -> None:
        self.matcher = matcher
        self.eog = eog
        self.n_vocab = n_vocab
        # free text until a trigger (a token id; text the answer ends with at a token's end; "^text": text the answer
        # starts with, structured/call_shapes.py), then the grammar, fed the answer from where the trigger began
        ids = [re.fullmatch(r"<\[(\d+)\]>", t) for t in triggers]
        self._trigger_ids = frozenset(int(m[1]) for m in ids if m)
        self._trigger_texts = tuple(t.encode() for t, m in zip(triggers, ids) if not m and not t.startswith(ANCHORED))
        self._anchored: tuple[str, ...] | None = tuple(t[len(ANCHORED):] for t in triggers
                                                       if t.startswith(ANCHORED)) or None
        self._piece = piece
        self._tokenize = tokenize
        self._answer: list[tuple[int, bytes]] = []  # before the trigger: the answer's tokens and their bytes
        self.active = not triggers
        # a tool call's grammar (schema.spec.TOOL_CALLS): where the model's own token is forbidden and the grammar may
        # end, the answer ends (it wants to write on after its calls; no call is forced out of it)
        self.ends_when_left = ends_when_left
        self._mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.seconds = 0.0  # host time spent in the grammar this generation
        self.dead_end = False  # no token was allowed: the grammar cannot go on
        # the position from which the answer is shut as fast as the grammar lets it (None: never), and the tokens
        # that may shut it: quotes, braces, brackets and commas (grammars._tokenizer)
        self.close_at: int | None = None
        self._closers = closers if closers is not None else np.zeros(0, dtype=np.int64)
        self._open = _Nesting()
        self._pending: list[int] = []  # consumed tokens the matcher has not stepped past yet (``_step``)
        self._validated: tuple[int, ...] = ()  # the last proposal's tokens, each allowed where it stands
        self._memo = memo if memo is not None else SpecMemo()
        self._fresh = True  # nothing consumed yet: the matcher is as compiled (``SpecMemo.first``)

    @property
    def failed(self) -> bool:
        """The matcher is in error (it took a token it should not have): the answer ends there, as a dead end."""
        return self.active and bool(self.matcher.is_error())

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but the end may follow (or it is in error)."""
        return self.active and bool(self.matcher.is_stopped())

    # -- propose: forced tokens, and drafts cut where the grammar forbids them --

    def propose(self, history: list[int], room: int, drafts: Callable[[list[int], int], Draft]) -> Draft:
        """The forced tokens (up to ``room``), then what ``drafts`` proposes after them, cut at its first token
        the grammar forbids. Drafts lose their probabilities: under a mask the draft model's q is not the
        distribution its tokens were drawn from, so they are verified as one-hot proposals (exact either way)."""
        self._validated = ()
        if not self.active:  # free text until a trigger: the drafts as they are, verified one-hot
            draft = drafts(history, room)
            return replace(draft, dists=None) if draft.dists else draft
        t0 = time.perf_counter()
        matcher = self.matcher
        forced_bytes, forced = self._forced() if room > 0 else (b"", [])
        forced = forced[:room]
        t1 = time.perf_counter()
        # a batch's draft model may ask to be answered later (DraftWanted): the matcher is never stepped here. The
        # history is copied only where forced tokens follow it: a draft model answered later reads the list it was
        # given after this returns, so forced tokens cannot be appended to the sequence's own list and taken off
        if room > len(forced):
            rest = drafts([*history, *forced] if forced else history, room - len(forced))
        else:
            rest = Draft()
        t2 = time.perf_counter()
        # the forced tokens and the rest validated in one call, none consumed (consuming the forced tokens,
        # validating and rolling back would cost three); forced tokens a spec's earlier answer tokenized may not fit
        n = matcher.validate_tokens([*forced, *rest.tokens]) if forced or rest.tokens else 0
        if n < len(forced):  # the spec's tokens for these bytes do not fit here: asked again next time
            self._memo.forced.pop(forced_bytes, None)
            forced, rest = forced[:n], Draft()
        n -= len(forced)
        self.seconds += (t1 - t0) + (time.perf_counter() - t2)
        self._validated = (*forced, *rest.tokens[:n])
        if not forced:
            return replace(rest, tokens=rest.tokens[:n], dists=None) if n < len(rest) or rest.dists else rest
        # the kind is the drafter's own: the forced tokens are counted apart (``forced``), and learned as their own
        # kind, never as a lookup's or a draft model's tokens (policy.DraftPolicy.observe)
        return Draft([*forced, *rest.tokens[:n]], None, rest.drafter if n else FORCED,
                     rest.kind if n else FORCED, forced=len(forced))

    def _forced(self) -> tuple[bytes, list[int]]:
        """The bytes the grammar forces next, and their tokens. llguidance tokenizes the forced bytes and drops what
        a later byte could merge with (~0.2 ms where any are forced here, 10x the bytes alone): the same bytes under
        the same spec tokenize the same way, so the tokens are kept per spec, bytes to tokens (validated with the
        draft)."""
        forced = self.matcher.compute_ff_bytes()
        if not forced:
            return forced, []
        known = self._memo.forced
        tokens = known.get(forced)
        if tokens is None:
            tokens = tuple(self.matcher.compute_ff_tokens())
            if len(known) < FORCED_KEPT and len(forced) <= FORCED_BYTES_KEPT:
                known[forced] = tokens
        return forced, list(tokens)

    # -- verify: each row's token, the grammar's state stepping along the accepted ones --

    def verify(
        self, draft: Sequence[int], outputs: np.ndarray, sampling: SamplingSettings,
        rng_at: Callable[[int], np.random.Generator], position: int = 0,
    ) -> Verdict:
        """Keep the draft while each token is the one the target picks under the grammar; row i's pick sees the
        grammar after ``draft[:i]``. Consumes what the verdict emits, an accepted run at once (the matcher steps
        only where a pick must look at it). ``position``: where row 0's token lands."""
        # the tokens ``propose`` validated lead the draft; a GPU's padding after them was never validated
        validated = self._validated
        try:
            for i, x in enumerate(draft):
                y = self._pick(outputs[i], sampling, rng_at, i, position,
                               x if i < len(validated) and validated[i] == x else None)
                self._consume(y)
                if y != x:
                    return Verdict(i, y)
            y = self._pick(outputs[len(draft)], sampling, rng_at, len(draft), position)
            self._consume(y)
            return Verdict(len(draft), y)
        finally:
            self._validated = ()
            self._step()

    def _pick(self, row: np.ndarray, sampling: SamplingSettings, rng_at: Callable[[int], np.random.Generator],
              i: int, position: int = 0, drafted: int | None = None) -> int:
        if not self.active:
            return int(row.argmax()) if sampling.greedy else shape(row, sampling).sample(rng_at(i))
        if self.close_at is not None and position + i >= self.close_at:
            self._step()
            return self._close(row)
        if sampling.greedy:
            token = int(row.argmax())  # what the pass's own read costs anyway: not the grammar's time
            if token == drafted and token not in self.eog:
                return token  # the draft's own, which ``propose`` validated at this very place
            self._step()
            t0 = time.perf_counter()
            if not self.allows(token):
                token = min(self.eog) if self.ends_when_left and self.matcher.is_accepting() \
                    else self._best_allowed(row, token)
            self.seconds += time.perf_counter() - t0
            return token
        self._step()
        return self.distribution(row, sampling).sample(rng_at(i))

    def _close(self, row: np.ndarray) -> int:
        """The token that shuts the answer soonest: the end where it may end, else the allowed closer that closes
        the most, else the model's best allowed token (a value the grammar still needs)."""
        t0 = time.perf_counter()
        token = min(self.eog) if self._fill_mask() else None
        if token is None and len(self._closers):
            shut = self._open.shutting()
            allowed = self._closers[self._bits(self._closers)]
            pieces = [self._piece(int(t)) if self._piece is not None else b"" for t in allowed]
            closing = [(len(p), int(t)) for t, p in zip(allowed, pieces, strict=True) if shut.startswith(p) and p]
            commas = [int(t) for t, p in zip(allowed, pieces, strict=True) if p.startswith(b",")]
            token = max(closing)[1] if closing else commas[0] if commas else None
        if token is None:
            ids = self._expand()
            token = self._masked_argmax(row, ids)
        self.seconds += time.perf_counter() - t0
        return token

    def allows(self, token: int) -> bool:
        if token in self.eog:
            return bool(self.matcher.is_accepting())
        return self.matcher.validate_tokens([token]) == 1

    def _consume(self, token: int) -> None:
        """``token`` is emitted: the grammar steps past it when a pick next looks at it (``_step``)."""
        if not self.active:
            self._watch(token)
            return
        if token not in self.eog and not self.dead_end:
            self._pending.append(token)

    def _step(self) -> None:
        """The matcher stepped past the tokens consumed since it last was, in one call."""
        pending = self._pending
        if not pending:
            return
        t0 = time.perf_counter()
        self._fresh = False
        self.matcher.consume_tokens(pending)
        if self.close_at is not None and self._piece is not None:
            for token in pending:
                self._open.feed(self._piece(token))
        self._pending = []
        self.seconds += time.perf_counter() - t0

    def _watch(self, token: int) -> None:
        """Before the trigger: has this token completed it? Then the grammar holds, fed from where it began. Called for
        every token of a free answer with tools offered: where only a marker token can start a call (the answer's
        start is past), it costs a set lookup."""
        if token in self._trigger_ids:  # the marker token: the call begins with it
            self._feed([token])
            return
        if not self._trigger_texts and self._anchored is None:
            return
        piece = self._piece(token) if self._piece is not None else b""
        answer = self._answer
        answer.append((token, piece))
        if self._trigger_texts:
            tail = b"".join(p for _, p in answer)  # the kept window (below): at least a marker's bytes
            for text in self._trigger_texts:
                if tail.endswith(text):
                    self._begin_at_byte(len(tail) - len(text))
                    return
        if self._anchored is not None:
            start = anchored_start(b"".join(p for _, p in answer).decode("utf-8", "replace"), self._anchored)
            if start:
                self._begin(0)
            elif start is False:  # the answer can no longer start as a call: only a marker may come now
                self._anchored = None
        if self._anchored is None:  # kept: only what a text marker may span
            kept, size = 0, 0
            while kept < len(answer) and size < 64:
                kept += 1
                size += len(answer[-kept][1])
            del answer[:len(answer) - kept]

    def _begin_at_byte(self, start: int) -> None:
        """The trigger began ``start`` bytes into the answer: fed from the token there, or, where a token straddles
        that byte, the trigger's bytes tokenized again (the grammar reads bytes: any tokens of them are the same)."""
        at = 0
        for i, (_, piece) in enumerate(self._answer):
            if at == start:
                self._begin(i)
                return
            if at > start:
                break
            at += len(piece)
        rest = b"".join(p for _, p in self._answer)[start:]
        if self._tokenize is not None:
            self._feed(self._tokenize(rest))

    def _begin(self, i: int) -> None:
        """The call began at the kept answer's ``i``-th token: the grammar takes over, fed from there."""
        self._feed([t for t, _ in self._answer[i:]])

    def _feed(self, tokens: list[int]) -> None:
        self._answer, self._anchored = [], None
        if self.matcher.validate_tokens(tokens) < len(tokens):  # written otherwise than the grammar would: text
            return
        self.active = True
        self._pending = list(tokens)

    def _fill_mask(self) -> bool:
        """The next token's mask into ``_mask``, with the ends allowed exactly where the grammar may end; whether
        it may end now."""
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        accepting = bool(self.matcher.is_accepting())
        words = self._mask.view(np.uint32)
        for token in self.eog:  # a handful
            bit = np.uint32(1 << (token & 31))
            words[token >> 5] = (words[token >> 5] | bit) if accepting else (words[token >> 5] & ~bit)
        return accepting

    def _best_allowed(self, row: np.ndarray, forbidden: int) -> int:
        """The row's best token the grammar allows, its argmax being ``forbidden``, found the cheap way for each kind
        of place:
        - the next best, checked alone (an argmax and a check): a space the compact JSON leaves out, the end where
          the grammar may end;
        - else the mask (0.02-0.3 ms): where it allows few tokens (a brace, a quote, digits: the answer's first
          token, a value's), the best of those;
        - else the next best few on the mask's bits, before the whole vocabulary's ids (~0.9 ms on Gemma's 262k).
        A check (``allows``: llguidance's validate_tokens) may take a spelling of forced bytes that the mask leaves
        out (``{`` where ``{"`` is forced): not always the masked argmax, but a function of the row and the grammar's
        state alone, so speculation and target-only pick alike (ties go to the lowest id either way)."""
        if not row.flags.writeable:
            return self._masked_argmax(row, self._allowed_ids())
        saved: list[tuple[int, float]] = []
        try:
            token = self._next_best(row, forbidden, saved)
            if self.allows(token):
                return token
            if self._fresh and self._memo.first is not None:
                return self._masked_argmax(row, self._memo.first)
            self._fill_mask()
            words = np.flatnonzero(self._mask)
            if len(words) <= _SPARSE_WORDS:
                ids = self._expand(words)
                if self._fresh:
                    self._memo.first = ids
                return self._masked_argmax(row, ids)
            for _ in range(_NEXT_BEST):
                token = self._next_best(row, token, saved)
                if self._mask.view(np.uint32)[token >> 5] >> np.uint32(token & 31) & 1:  # allowed
                    return token
        finally:
            for token, value in reversed(saved):
                row[token] = value  # the row is the pass's own logits
        return self._masked_argmax(row, self._expand(words))

    @staticmethod
    def _next_best(row: np.ndarray, worse: int, saved: list[tuple[int, float]]) -> int:
        """The row's best token once ``worse`` is out of it (put back from ``saved`` by the caller)."""
        saved.append((worse, float(row[worse])))
        row[worse] = -np.inf
        return int(row.argmax())

    def _masked_argmax(self, row: np.ndarray, ids: np.ndarray) -> int:
        return int(ids[row[ids].argmax()]) if len(ids) else self._stuck()

    def _allowed_ids(self) -> np.ndarray:
        """The ids the grammar allows next, ascending."""
        self._fill_mask()
        return self._expand()

    def _expand(self, words: np.ndarray | None = None) -> np.ndarray:
        """The mask just filled, as ascending ids; ``words``: its non-zero 32-token words, where known. Where few
        tokens are allowed only those words are expanded."""
        if words is None:
            words = np.flatnonzero(self._mask)
        if len(words) > _SPARSE_WORDS:
            return np.flatnonzero(np.unpackbits(self._mask.view(np.uint8), bitorder="little")[: self.n_vocab])
        bits = np.unpackbits(self._mask[words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
        ids = (words[:, None] * 32 + np.arange(32))[bits.astype(bool)]
        return ids[ids < self.n_vocab]

    def _stuck(self) -> int:
        """Nothing is allowed: end the answer here with what it has (finish reason "dead_end")."""
        self.dead_end = True
        return min(self.eog)

    def distribution(self, row: np.ndarray, s: SamplingSettings) -> Distribution:
        """The target's distribution under the grammar: the mask, then top-k / top-p / min-p / temperature."""
        n = row.shape[0]
        if 0 < s.top_k < n:
            m = min(n, max(4 * s.top_k, _CANDIDATES_MIN))
            candidates = top_k(row, m)  # what plain top-k pays too
            t0 = time.perf_counter()
            self._fill_mask()
            ok = self._bits(candidates)
            self.seconds += time.perf_counter() - t0
            if int(ok.sum()) >= s.top_k:  # the k best allowed tokens are among these: exact
                ids = candidates[ok]
                ids = ids[top_k(row[ids], s.top_k)]
                return shape_candidates(ids, row[ids], s)
        t0 = time.perf_counter()
        ids = self._expand() if 0 < s.top_k < n else self._allowed_ids()  # top-k filled the mask already
        self.seconds += time.perf_counter() - t0
        if not len(ids):
            return Distribution.one_hot(self._stuck())
        if 0 < s.top_k < len(ids):
            ids = ids[top_k(row[ids], s.top_k)]
        return shape_candidates(ids, row[ids], s)

    def _bits(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` is allowed, from the mask just filled."""
        words = self._mask.view(np.uint32)
        return ((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


class _Nesting:
    """What an answer's JSON holds open, from the bytes it wrote: a string, and the objects and lists around it."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.in_string = False
        self.escaped = False

    def feed(self, data: bytes) -> None:
        for c in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == 0x5C:  # backslash
                    self.escaped = True
                elif c == 0x22:  # quote
                    self.in_string = False
            elif c == 0x22:
                self.in_string = True
            elif c in (0x7B, 0x5B):  # { [
                self.stack.append(c)
            elif c in (0x7D, 0x5D) and self.stack:  # } ]
                self.stack.pop()

    def shutting(self) -> bytes:
        """The bytes that close everything open, innermost first."""
        return (b'"' if self.in_string else b"") + bytes(0x7D if c == 0x7B else 0x5D for c in reversed(self.stack))
