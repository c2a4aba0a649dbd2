"""Earlier requests' token sequences, searched by suffix: the store behind drafts from what was written before.

One ``Shelf`` per scope (the user's own work, or one API key of a server), so one scope's text can never be drafted
into another's. A shelf is flat numpy arrays, saved and loaded as they are:

- ``tokens``: every kept sequence, one after the other, each followed by ``SEP`` (int32);
- ``serials``/``starts``: when each sequence was added (a counter shared by all shelves: the oldest goes first) and
  where it starts in ``tokens``;
- for each n in ``NS``: the hashes of every n-gram that ends just before a position, sorted (uint64), and those
  positions (int32), ordered by (hash, position). The positions of one n-gram form one slice of the sorted arrays:
  its length is how often the n-gram occurred, its tail the most recent occurrences, and what followed each is the
  token at its position. So counts come for free, and a sequence appended is a merge (``np.insert``), not a sort.

A lookup hashes the history's suffix for each n (backwards from its last token, so every n is one more step of the
same fold), finds the longest n that occurred (a binary search: if an n-gram occurred, its shorter suffixes did
too), and proposes what most often followed its most recent occurrences, token by token (``_walk``). About 12 bytes
a token per n: 8 n's and the tokens are ~100 bytes a token (today's in-request index: ~260, and no counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

NS = (1, 2, 3, 4, 6, 8, 12, 16)  # the n-gram lengths indexed (a match is found at the longest of these)
SEP = -1  # after every sequence: no n-gram spans it, no draft runs past it
_P = 0x100000001B3  # the fold's multiplier (FNV's 64-bit prime)
_MASK = (1 << 64) - 1
_OFFSETS = np.arange(64, dtype=np.int32)
_RECENT = 8  # occurrences of the matched n-gram whose continuations are weighed (the most recent)
# A continuation is a slot's (varied) where this many occurrences or more went on in ways of which none has half,
# after a context at least _SLOT_N long (the match and the draft so far; a shorter one cannot say which way it goes)
_VARIED_ROWS = 3
_SLOT_N = 4
DEFAULT_MAX_TOKENS = 1_000_000  # the bound over all scopes; the oldest sequences go first
NEAR_WINDOW = 64  # how far past the place an earlier answer was followed to its template's next step is looked for


def suffix_hashes(tail: Sequence[int], n_max: int) -> list[int]:
    """h[n-1] = the hash of the last n tokens of ``tail`` (n = 1..min(n_max, len(tail))), as ``_hashes`` makes."""
    out: list[int] = []
    h = 0
    for t in reversed(tail[-n_max:]):
        h = (h * _P + t + 1) & _MASK  # +1: token 0 must change the hash
        out.append(h)
    return out


def _hashes(tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, positions) of the n-grams of ``tokens`` (one or more sequences each followed by SEP) that span no SEP
    and are followed by a token; a position is where the continuation is."""
    total = len(tokens)
    if total <= n:
        return np.empty(0, np.uint64), np.empty(0, np.int32)
    ends = np.arange(n, total)  # continuation positions j: the n-gram is tokens[j-n:j]
    ok = tokens[ends] != SEP
    h = np.zeros(len(ends), np.uint64)
    p = np.uint64(_P)
    with np.errstate(over="ignore"):
        for back in range(1, n + 1):  # newest token first, as suffix_hashes folds
            t = tokens[ends - back]
            ok &= t != SEP
            h = h * p + (t.astype(np.int64) + 1).astype(np.uint64)
    order = np.argsort(h[ok], kind="stable")
    return h[ok][order], ends[ok][order].astype(np.int32)


@dataclass
class Match:
    """A proposal from the store: the n-gram length matched, how often its chosen continuation followed, the
    tokens, and where they were copied from (to keep following that place). ``varied``: the earlier occurrences
    went on in different ways, none in most of them (a template's slot: what follows ``"city": "``)."""

    n: int
    count: int
    tokens: list[int]
    source: int
    varied: bool = False
    split: bool = False  # the earlier occurrences did not all go on with the first token drafted
    # where the earlier continuations forked (not a slot: one way has half of them), the runner-up ways, each as a
    # whole candidate (the shared part, then its own), the first fork's first: a token tree's other branches
    others: list[list[int]] = field(default_factory=list)


@dataclass
class Shelf:
    """One scope's sequences and index."""

    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    serials: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # per sequence, whose it is where that matters later (a chat's conversation id: deleting the conversation
    # forgets its turns); 0: nobody's in particular
    tags: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    keys: dict[int, np.ndarray] = field(default_factory=dict)
    positions: dict[int, np.ndarray] = field(default_factory=dict)
    epoch: int = 0  # bumped when positions shift (the oldest dropped): a place followed is no longer valid

    def __post_init__(self) -> None:
        if len(self.tags) != len(self.serials):  # a file written before tags: nobody's
            self.tags = np.zeros(len(self.serials), np.int64)
        for n in NS:
            self.keys.setdefault(n, np.empty(0, np.uint64))
            self.positions.setdefault(n, np.empty(0, np.int32))

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) - len(self.starts)  # separators are not text

    @property
    def n_requests(self) -> int:
        return len(self.starts)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tokens, self.starts, self.serials, self.tags, *self.keys.values(),
                                      *self.positions.values()))

    def add(self, sequence: Sequence[int], serial: int, tag: int = 0) -> None:
        self.extend([sequence], [serial], [tag])

    def extend(
        self, sequences: Sequence[Sequence[int]], serials: Sequence[int], tags: Sequence[int] | None = None,
    ) -> None:
        """Append sequences and merge their n-grams into the sorted index (new positions sort after old ones)."""
        if not sequences:
            return
        base = len(self.tokens)
        lengths = np.array([len(s) + 1 for s in sequences], np.int64)
        new = np.full(int(lengths.sum()), SEP, np.int32)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for at, seq in zip(starts.tolist(), sequences, strict=True):
            new[at : at + len(seq)] = seq
        self.tokens = np.concatenate([self.tokens, new])
        self.starts = np.concatenate([self.starts, starts + base])
        self.serials = np.concatenate([self.serials, np.asarray(serials, np.int64)])
        self.tags = np.concatenate([self.tags, np.asarray(tags if tags is not None else [0] * len(sequences),
                                                          np.int64)])
        for n in NS:
            h, pos = _hashes(new, n)
            if not len(h):
                continue
            at = np.searchsorted(self.keys[n], h, side="right")
            self.keys[n] = np.insert(self.keys[n], at, h)
            self.positions[n] = np.insert(self.positions[n], at, pos + base)

    def drop_oldest(self, count: int) -> None:
        """Drop the first ``count`` sequences (the oldest: a shelf only appends)."""
        if count <= 0:
            return
        if count >= len(self.starts):
            self.__init__(epoch=self.epoch + 1)  # type: ignore[misc]
            return
        cut = int(self.starts[count])
        self.tokens = self.tokens[cut:].copy()
        self.starts = self.starts[count:] - cut
        self.serials = self.serials[count:].copy()
        self.tags = self.tags[count:].copy()
        for n in NS:
            keep = self.positions[n] >= cut
            self.keys[n] = self.keys[n][keep]
            self.positions[n] = self.positions[n][keep] - cut
        self.epoch += 1

    def sequences(self) -> list[np.ndarray]:
        """Each kept sequence's tokens, oldest first."""
        ends = [*self.starts[1:].tolist(), len(self.tokens)]
        return [self.tokens[a : b - 1] for a, b in zip(self.starts.tolist(), ends, strict=True)]

    def without(self, tag: int) -> Shelf:
        """This shelf less the sequences tagged ``tag`` (rebuilt: positions change, so at a later epoch)."""
        keep = np.flatnonzero(self.tags != tag).tolist()
        seqs = self.sequences()
        shelf = Shelf(epoch=self.epoch + 1)
        shelf.extend([seqs[i] for i in keep], self.serials[keep].tolist(), self.tags[keep].tolist())
        return shelf

    def lookup(
        self, tail: Sequence[int], cap: int, width: int = 1, hashes: Sequence[int] | None = None,
    ) -> Match | None:
        """The continuation of the longest indexed suffix of ``tail`` that occurred here (None if none did), with up
        to ``width`` - 1 other branches where earlier continuations forked. ``hashes``: ``suffix_hashes(tail,
        NS[-1])``, where the caller has them (a drafter's step folds them once for this and ``near``)."""
        if cap <= 0 or not len(self.tokens):
            return None
        if hashes is None:
            hashes = suffix_hashes(tail, NS[-1])
        ns = [n for n in NS if n <= len(hashes)]
        # binary search for the longest n that occurred (occurrence is monotone in n)
        lo, hi, found = 0, len(ns) - 1, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            n = ns[mid]
            keys, h = self.keys[n], np.uint64(hashes[n - 1])
            i = int(keys.searchsorted(h))
            if i < len(keys) and keys[i] == h:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        if found < 0:
            return None
        n = ns[found]
        keys, h = self.keys[n], np.uint64(hashes[n - 1])
        first, end = int(keys.searchsorted(h)), int(keys.searchsorted(h, side="right"))
        starts = self.positions[n][max(first, end - _RECENT) : end]
        cap = min(cap, 4 * n)  # longer drafts where the match is longer (SuffixDecoding's max_spec_factor)
        rows = self.tokens.take(starts[:, None] + _OFFSETS[:cap], mode="clip").tolist()
        return _walk(rows, starts.tolist(), n, width - 1)

    def near(
        self, tail: Sequence[int], at: int, cap: int, epoch: int, window: int = NEAR_WINDOW, *,
        hashes: Sequence[int] | None = None, longest: int = NS[-1],
    ) -> Match | None:
        """The continuation of the longest indexed suffix of ``tail`` that occurred after ``at`` (within ``window``
        tokens, in ``at``'s sequence), nearest first; None if none did, or if positions are no longer ``epoch``'s.

        Where an answer follows an earlier one's template but differs in a part (a name, a number), the suffix after
        that part (``",``) occurs all over the shelf, after every key; after the place the earlier answer was
        followed up to, its nearest occurrence is the template's next step. ``hashes``: as ``lookup``'s;
        ``longest``: the longest n whose n-gram occurred anywhere on the shelf (``lookup``'s match), where known."""
        if cap <= 0 or epoch != self.epoch or at >= len(self.tokens):
            return None
        seq = int(self.starts.searchsorted(at, side="right"))  # at's sequence is seq - 1: it ends where seq starts
        limit = min(at + window, int(self.starts[seq]) if seq < len(self.starts) else len(self.tokens))
        if hashes is None:
            hashes = suffix_hashes(tail, NS[-1])
        for n in reversed([n for n in NS if n <= min(len(hashes), longest)]):
            keys, h = self.keys[n], np.uint64(hashes[n - 1])
            first = int(keys.searchsorted(h))
            if first == len(keys) or keys[first] != h:
                continue
            end = int(keys.searchsorted(h, side="right"))
            positions = self.positions[n][first:end]  # one n-gram's positions are in order
            i = int(positions.searchsorted(at, side="right"))
            if i < len(positions) and positions[i] < limit:
                source = int(positions[i])
                return Match(n, 1, self.continuation(source, min(cap, 4 * n), epoch), source)
        return None

    def continuation(self, at: int, cap: int, epoch: int) -> list[int]:
        """The tokens from ``at`` up to the end of its sequence (at most ``cap``), if positions are still those of
        ``epoch``."""
        if epoch != self.epoch or at >= len(self.tokens):
            return []
        return _to_end(self.tokens[at : at + cap].tolist())


def _to_end(row: list[int]) -> list[int]:
    """``row`` up to the end of its sequence (the separator before the next one)."""
    return row[: row.index(SEP)] if SEP in row else row


def _walk(rows: list[list[int]], starts: list[int], n: int, branches: int = 0) -> Match | None:
    """Token by token, what most of the rows still in agreement say next (ties: the most recent); the draft ends
    where rows run out (a sequence's end), or before a slot, where they go different ways. ``rows`` oldest first,
    as ``starts``. Identical rows (a template's) are weighed once with their count, and once one row is left its
    tokens are taken whole. At each fork the runner-up way (its most recent row) is kept as another branch, up to
    ``branches`` of them."""
    distinct: dict[tuple[int, ...], list[int]] = {}  # row -> [count, its most recent index]
    for i, row in enumerate(rows):
        seen = distinct.get(key := tuple(row))
        if seen is None:
            distinct[key] = [1, i]
        else:
            seen[0] += 1
            seen[1] = i
    alive = sorted(distinct.items(), key=lambda kv: -kv[1][1])  # newest first: a tie goes to the first counted
    out: list[int] = []
    others: list[list[int]] = []
    count = 0
    varied = split = False
    for depth in range(len(rows[0])):
        if len(alive) == 1:
            out += _to_end(list(alive[0][0][depth:]))
            if depth == 0:
                count = alive[0][1][0]
            break
        token = alive[0][0][depth]
        if token != SEP and all(row[depth] == token for row, _ in alive):  # every row agrees: no fork, no slot
            if depth == 0:
                count = sum(c for _, (c, _) in alive)
            out.append(token)
            continue
        counts: dict[int, int] = {}
        for row, (c, _) in alive:
            t = row[depth]
            if t != SEP:
                counts[t] = counts.get(t, 0) + c
        if not counts:
            break
        best = max(counts, key=counts.__getitem__)
        weight = sum(counts.values())
        if n + depth >= _SLOT_N and weight >= _VARIED_ROWS and 2 * counts[best] < weight:  # a slot: it stops
            varied = depth == 0
            break
        if depth == 0:
            count, split = counts[best], len(counts) > 1
        if len(others) < branches and len(counts) > 1:
            second = max((t for t in counts if t != best), key=counts.__getitem__)
            others.append(out + _to_end(list(next(r for r, _ in alive if r[depth] == second)[depth:])))
        out.append(best)
        alive = [a for a in alive if a[0][depth] == best]
    if varied:
        return Match(n, 0, [], starts[alive[0][1][1]], varied=True)
    if not out or not alive:
        return None
    return Match(n, count, out, starts[alive[0][1][1]], split=split, others=others)
