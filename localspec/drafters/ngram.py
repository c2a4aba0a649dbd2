"""Prompt-lookup drafting: continue the text the way it continued the last time its suffix appeared.

The index maps every n-gram (n = 1..max_n) of the history to the positions right after its most recent
occurrences (a few); it grows by max_n dictionary writes per accepted token, so a step costs the same on a
32k-token context as on a short one. Three refinements over plain lookup:

- **follow**: once a draft copied from some place was accepted in full (bonus token included), keep copying
  from that same place rather than re-looking the suffix up: when the model is reproducing a passage, the most
  recent occurrence of a short suffix is often somewhere else (its own output), while the passage goes on.
- **kinds**: the draft says what it is based on ("ngram/follow", "ngram/3", ...) so the draft-length policy learns
  separately how far each kind of match deserves to be trusted. A kind ends in "~" where the suffix's recent
  occurrences went on in more than one way (a template's slot: the next key of a JSON line, a value): the follow
  copies the previous call line right through its shared structure and wrong at its keys, and one estimate for
  both drafted at the keys (Qwen2.5-Coder 1.5B, the tool-calls suite at ddadfad: 0.93x of target-only)
- **history**: given earlier requests' text (a ``HistoryView``: localspec/history), the same lookup searches it too;
  the longest match leads wherever it is, a tie goes to the source whose continuation followed more often, and its
  drafts are of their own kinds ("cache/3", "cache/follow") so the policy learns what they are worth apart (and
  ranks the two sources by it: policy.DraftPolicy.trim). A template's slot (where earlier answers went different
  ways: a name) is not drafted; after it the text goes on near the place of the earlier answer it followed up to
  there (an anchor: "cache/near1".."cache/near3"), not after whichever key came last.
- **candidates**: asked for a width above 1, it adds other continuations (earlier occurrences of the longest
  match, most recent first, then of shorter ones; from the history, the runner-up ways where earlier continuations
  forked), which the loop can verify together as a token tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from localspec.drafters.base import Draft, match_bucket
from localspec.events import CACHE_KIND
from localspec.history.store import NS, suffix_hashes
from localspec.tokens import common_prefix

if TYPE_CHECKING:
    from localspec.history import HistoryView


_RECENT = 4  # occurrences kept per n-gram: the sources of a tree's other candidates
NEAR_TRUSTED = 3  # a match this long near the anchor beats a longer one elsewhere


class NgramDrafter:
    name = "ngram"
    lookup = True

    def __init__(self, max_n: int = 8, min_n: int = 1, history: HistoryView | None = None) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self.history = history
        # where the last draft from the history was copied from, and where to keep copying from after it was
        # accepted whole (positions in its scope's shelf, valid while the shelf's epoch holds)
        self._cache_source: tuple[int, int] | None = None
        self._cache_matched = 0  # the length of the match the last draft from the history rests on
        self._cache_follow: tuple[int, int] | None = None
        # where the text last went on as an earlier answer did, up to the token where it parted from it: that
        # answer's template goes on near there (HistoryView.near)
        self._cache_anchor: tuple[int, int] | None = None
        self._tokens: list[int] = []
        # n -> n-gram -> the positions that followed its most recent occurrences, oldest first
        self._index: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]
        self._sources: list[int] = []  # where the last draft's candidates were copied from
        self._follow: int | None = None  # where to keep copying from, after a fully accepted draft

    def begin(self, history: Sequence[int]) -> None:
        if not self._extends(history):
            self._tokens = []
            self._index = [{} for _ in range(self.max_n + 1)]
        self._follow = None
        self._cache_follow = self._cache_source = self._cache_anchor = None
        self._sources = []
        self._extend(history)

    def _extends(self, history: Sequence[int]) -> bool:
        n = len(self._tokens)
        if n > len(history):
            return False
        # a sample of positions (ends and middle) is enough: histories here only ever grow at the tail
        probe = {0, n // 2, n - 1} if n else set()
        return all(history[i] == self._tokens[i] for i in probe)

    def _extend(self, history: Sequence[int]) -> None:
        tokens, index = self._tokens, self._index
        # a grammar's forced tokens were proposed past (structured/constraint.py) and the target chose otherwise:
        # forget the tail that the history did not keep
        while tokens and (len(tokens) > len(history) or tokens[-1] != history[len(tokens) - 1]):
            self._forget_last()
        for j in range(len(tokens), len(history)):
            tokens.append(history[j])
            # register the n-grams that end just before j: their continuation starts at j
            longest = tuple(tokens[max(0, j - self.max_n) : j])
            for n in range(1, len(longest) + 1):
                gram = longest[-n:]
                seen = index[n].get(gram)
                if seen is None:
                    index[n][gram] = [j]
                else:
                    seen.append(j)
                    if len(seen) > _RECENT:
                        del seen[0]

    def _forget_last(self) -> None:
        """Drop the last token and the n-grams that registered it as their continuation."""
        tokens, j = self._tokens, len(self._tokens) - 1
        for n in range(1, min(self.max_n, j) + 1):
            gram = tuple(tokens[j - n : j])
            seen = self._index[n].get(gram)
            if seen and seen[-1] == j:
                seen.pop()
                if not seen:
                    del self._index[n][gram]
        tokens.pop()

    def _matches(self, want: int) -> list[tuple[int, int]]:
        """(start, n) of the earlier occurrences of the history's suffix, longest match first, most recent first;
        the search stops at the n where it has ``want`` of them."""
        tokens = self._tokens
        out: list[tuple[int, int]] = []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            starts = self._index[n].get(tuple(tokens[-n:]))
            if starts is not None:
                out.extend((start, n) for start in reversed(starts))
                if len(out) >= want:
                    break
        return out

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        self._extend(history)
        self._sources = []
        self._cache_source = None
        if cap <= 0:
            return Draft(drafter=self.name)
        follow = self._follow if self._follow is not None and self._follow < len(self._tokens) else None
        # the own text's longest matches, looked up once for both sources (the history's compares its match with them)
        mine = self._matches(1 if width == 1 else 2 * width) if follow is None or width > 1 else []
        cached, leads = (None, False) if follow is not None or self.history is None \
            else self._from_history(cap, width, mine)
        own = self._own(cap, width, follow, mine)
        if cached is not None and leads:  # the other rides along: the policy ranks the two by what they earned
            return replace(cached, fallback=own if own.tokens else None)
        if not own.tokens:
            return cached or own
        return replace(own, fallback=cached)

    def _own(self, cap: int, width: int, follow: int | None, mine: list[tuple[int, int]]) -> Draft:
        """The sequence's own proposal: from ``follow`` (after a fully accepted draft), else its longest matches
        (``mine``: ``_matches``)."""
        tokens = self._tokens
        if follow is None and not mine:
            return Draft(drafter=self.name)
        # where the text's own occurrences of its suffix went on in more than one way (a template's slot: a JSON
        # key after `", "`, a value after `": "`), a copy is a bet of another worth: learned as its own kind
        split = "~" if self._split(mine) else ""
        sources = [(follow, f"{self.name}/follow{split}")] if follow is not None else []
        if not sources or width > 1:
            sources += [(start, f"{self.name}/{match_bucket(n)}{split}") for start, n in mine]
        candidates: list[list[int]] = []
        first_kind = ""
        for start, kind in sources:
            candidate = tokens[start : start + cap]
            # a candidate the tree already holds (the same tokens, or a prefix of them) adds nothing
            if any(c[: len(candidate)] == candidate for c in candidates):
                continue
            if not candidates:
                first_kind = kind
            candidates.append(candidate)
            self._sources.append(start)
            if len(candidates) == width:
                break
        if not candidates:
            return Draft(drafter=self.name)
        return Draft(candidates[0], None, self.name, first_kind, tuple(candidates[1:]))

    def _split(self, mine: list[tuple[int, int]]) -> bool:
        """Whether the recent occurrences of the text's longest matching suffix went on in more than one way
        (``mine``: ``_matches``; a follow, which copies without one, looks it up here)."""
        mine = mine or self._matches(1)
        tokens = self._tokens
        return bool(mine) and any(tokens[s] != tokens[mine[0][0]] for s, n in mine if n == mine[0][1])

    def _from_history(self, cap: int, width: int, mine: list[tuple[int, int]]) -> tuple[Draft | None, bool]:
        """A draft from earlier requests (None: nothing matched), and whether it leads: where it matches longer than
        the sequence's own text (or as long, with a continuation that followed more often), or where the last one
        was accepted whole. Where earlier answers went different ways (a template's slot: a name, a number) no
        copy is likely right: nothing is drafted, but the place is kept, to go on from after the slot."""
        view = self.history
        assert view is not None
        if not view.shelf.n_requests:  # nothing earlier in this scope (a first request): no fold, no search
            return None, False
        epoch = view.epoch
        tokens = self._tokens
        hashes = suffix_hashes(tokens, NS[-1])  # folded once for the lookup and ``near``
        match = view.lookup(tokens, cap, width, hashes)
        slot = match is not None and match.varied
        if self._cache_follow is not None and self._cache_follow[1] == epoch:
            draft = view.continuation(self._cache_follow[0], cap, epoch)
            if draft:
                self._cache_source, self._cache_matched = (self._cache_follow[0], epoch), NEAR_TRUSTED
                return (None, False) if slot else (Draft(draft, None, self.name, f"{CACHE_KIND}follow"), True)
        if match is None:
            return None, False
        bucket = "8+" if match.n >= 8 else "4+" if match.n >= 4 else str(match.n)
        if match.split:  # the earlier answers went on in more than one way here: a bet of another worth
            bucket += "~"
        near = None
        if self._cache_anchor is not None:
            at, anchored = self._cache_anchor
            near = view.near(tokens, at, cap, anchored, hashes=hashes, longest=match.n)
            # the place nearest after the anchor, unless a match elsewhere is longer than a short one here
            if near is not None and near.n >= min(match.n, NEAR_TRUSTED):
                match, bucket = near, f"near{min(near.n, NEAR_TRUSTED)}"
        self._cache_source, self._cache_matched = (match.source, epoch), match.n
        if slot:
            return None, False
        own = mine[0][1] if mine else 0  # the own longest match (``mine``: most recent first)
        # how many of its occurrences went on as the most recent one did: the own source's support at a tie
        support = sum(tokens[s] == tokens[mine[0][0]] for s, m in mine if m == own) if mine else 0
        n = min(match.n, self.max_n)  # the own index sees no further than max_n: compare like with like
        leads = n > own or (n == own and (match is near or match.count > support))
        # where earlier continuations forked, the runner-up ways ride along: the loop may verify them as a tree
        return Draft(match.tokens[:cap], None, self.name, f"{CACHE_KIND}{bucket}", tuple(match.others)), leads

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        self._extend(history)
        self._follow = self._cache_follow = None
        # the step's tokens (accepted draft, then the target's own) all continue a source: keep following it.
        # Compare them all: under `auto` the accepted tokens may have come from another drafter, and with a tree
        # from any of the ``verified`` candidates (not from one the policy trimmed off: unverified, it says little)
        n = n_accepted + 1
        if self._cache_source is not None and self.history is not None:
            at, epoch = self._cache_source
            source = self.history.continuation(at, n, epoch)
            if source == self._tokens[-n:]:
                self._cache_follow = (at + n, epoch)
                return
            went_on = common_prefix(source, self._tokens[-n:])
            # a short match whose first token missed says nothing of where the text is: the anchor stays
            if went_on or self._cache_matched >= NEAR_TRUSTED:
                self._cache_anchor = (at + went_on, epoch)
        for source in self._sources[:verified]:
            nxt = source + n
            if nxt < len(self._tokens) and self._tokens[source:nxt] == self._tokens[-n:]:
                self._follow = nxt
                break

    def close(self) -> None:
        self._tokens = []

