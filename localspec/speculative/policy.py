"""The draft-length policy: how many tokens each step drafts, chosen to maximise expected tokens per second.

Drafters only propose; the loop asks the policy for a cap before proposing and to trim the proposal after
(``cap`` / ``trim``), then tells it what the step cost and kept (``observe``).

A pass that verifies k drafted tokens emits 1 + (accepted prefix) tokens and costs verify(k+1) + k·draft_cost.
Acceptance is not independent per token — a copied passage is either the right one (and then goes on) or not —
so we learn, per kind of draft (drafter and match kind, e.g. "ngram/4+"), the conditional probability that
draft position j is accepted given that positions < j were: E[accepted | k] = Σ_{j<k} Π_{i≤j} c_i.
verify(n) is measured per batch size (on CPU, batches of a multiple of 4 tokens are markedly cheaper: the
curve is not linear), seeded from a calibration and corrected by every pass (speculative/costs.py: robust to a slow
pass and to a calibration taken on a busy machine). Acceptance estimates decay, so choices follow the text.
k = 0 is a plain decoding step: a drafter that does not pay is switched off, and probed now and then.

Lookup drafts (free to propose) are learned in hindsight: the whole proposal, before it was trimmed to k, is
compared with the tokens the target goes on to emit. Those do not depend on the draft: greedy tokens are the
target's argmax (up to the batch-vs-single numerics), and sampled tokens verified against a one-hot draft are drawn
from the position's own random stream (verify.py). So the policy learns how far a kind of match really runs even
while it drafts only 3 tokens, or none: without this, positions it never drafts never earn trust, and a long copy is
verified 4 tokens at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from localspec.drafters.base import Draft, Drafter
from localspec.events import CACHE_KIND, PREDICTION_KIND
from localspec.speculative.costs import PassCosts
from localspec.speculative.pass_sizes import PassSizes
from localspec.speculative.shapes import STEADY, Depths, Shapes, Warmup
from localspec.speculative.survival import DECAY, Survival, Watched
from localspec.speculative.tree import trie_sizes

_PROBE_EVERY = 16  # plain steps before a drafter that lost its place is tried again
_PROBE_EVERY_MAX = 256
_PROBE_K = 3
# A tree must promise this much more than the best chain, and its width must have been seen this often: the policy
# weighs some 50 shapes a step, and the best of many noisy estimates is biased up (tools/replay_tables.py --trees:
# the lowest prompt's trees ÷ chain is what these guard)
_TREE_MARGIN = 1.1
_TREE_EVIDENCE = 4.0
# A model drafter is probed only where a draft it gets this often right, a token at a time, would make the pass this
# much faster: a probe pays for more than its draft (its catch-up first: the prompt, then the text written since its
# last draft). Qwen2.5-Coder 1.5B with its 0.5B on this 2-core CPU (2026-11-28): the draft agreed 84-94% a token, a
# 3-token draft it got 90% right would have made a pass 2% faster, and its probes cost 1.3 s of a 6.5 s answer
_MODEL_PROBE_AGREEMENT = 0.9
_MODEL_PROBE_GAIN = 1.1
# c_0 of a request's prediction where it says the answer goes on (its follow) before any evidence: its client says the
# answer is mostly this text, so it is drafted from the first step. At the usual prior a lookup is not drafted until
# hindsight has earned it: four or five plain passes into every answer, a third of an edits-suite file (a pass of 4
# rows cost 2.3 of one on the 2-core EPYC, 2026-12-06: 0.6 drafted nothing either). A wrong one costs one draft
# before its first miss brings it down; the places found again after an edit are guesses, at the usual prior
PREDICTION_PRIOR = 0.8
PREDICTION_FOLLOW = PREDICTION_KIND + "follow"


class DraftPolicy(PassSizes):
    """Picks k per step; ``fixed`` pins it (``--k N``)."""

    def __init__(
        self, k_max: int = 16, fixed: int | None = None, branches: int = 1, costs: PassCosts | None = None,
        shapes: Shapes | None = None, shared: dict[str, Survival] | None = None, reproducible: bool = False,
    ) -> None:
        self.k_max = k_max
        # a seeded sampled request's: nothing measured live (a pass's seconds, a drafted token's) steers its draft
        # lengths, so they are the same run after run (its ``costs`` come frozen: PassCosts.frozen)
        self.reproducible = reproducible
        self.fixed = fixed
        self.branches = branches  # the most candidates a lookup may offer, verified together as a token tree
        # the device's pass sizes (a GPU's CUDA graphs): lookup drafts are then verified in passes of one kept size,
        # padded up to it, and the size changes only when that pays for the change (speculative/shapes.py); as
        # chains: a tree's size is its nodes', so it would change the size (``width``)
        self.shapes = shapes if shapes is not None and shapes.active else Shapes()
        self.size = 0  # the kept size of this sequence's passes (0: none chosen yet)
        # in a batch the scheduler keeps the pass's size (its rows summed over the sequences) and pads it: each
        # sequence drafts as it would without shapes, and ``pad`` is told how far to go
        self.in_batch = False
        # what a target pass costs on this device: calibrated, corrected by every pass the loop makes; it is the
        # device's, not the text's, so ``reset`` keeps it, and the sequences of a batch share one
        self.costs = costs if costs is not None else PassCosts()
        # the rest of the pass this sequence's rows join (a batch's other sequences): rows, and the tokens they are
        # expected to emit; a draft is priced as what it adds to the whole pass
        self.others: tuple[int, float] = (0, 0.0)
        # the tokens a grammar forced ahead of this step's draft (``follow``): rows of the same pass, each nearly
        # always accepted; a draft after them is priced as what it adds to a pass that holds them already, and a
        # lookup's proposal, made after them, is scored from where it begins
        self._after: tuple[int, ...] = ()
        self.expected = 1.0  # tokens the last chosen draft is expected to emit (its accepted prefix + the target's)
        self._drafter_calibration: dict[str, float] = {}
        # what each kind of draft is worth: earlier requests' kinds ("cache/…") in the job's record, which a job of
        # many sequences (a batch, a server's requests of one scope) shares; the text's own kinds in the sequence's
        # (a code prompt's "ngram/4+" is not a chat prompt's: shared, a mixed batch made ~10% fewer tokens a second)
        self.shared = shared if shared is not None else {}
        self.learned: dict[str, Survival] = {}
        self._fresh()

    def reset(self) -> None:
        """Forget what was learned about the text's own drafts and a drafter's cost per token; what earlier
        requests' drafts are worth (the job's) and pass costs stay."""
        self.learned = {}
        self._fresh()

    def _fresh(self) -> None:
        self._draft_cost: dict[str, float] = dict(self._drafter_calibration)  # seconds per drafted token
        self._plain_steps: dict[str, int] = {}
        self._patience: dict[str, int] = {}
        # what each depth the policy may choose would have made (a device with pass shapes only)
        self.depths = Depths(tuple(s - 1 for s in self.shapes.sizes if s <= self.k_max + 1)) if self.shapes.active \
            else None
        self.restart()

    def restart(self) -> None:
        """A new generation: proposals still waiting for their outcome belong to the old text, and its prefill
        changed the pass shape (a GPU's graph warms up again)."""
        self.warmup = Warmup()
        # what a request's prediction is worth (drafters/prediction.py): its own, forgotten when its generation ends;
        # its follow starts at the client's word
        self.predicted: dict[str, Survival] = {PREDICTION_FOLLOW: Survival(prior=PREDICTION_PRIOR)}
        self._watched: list[Watched] = []
        self._trimmed: Draft | None = None  # the last draft `trim` cut from a watched proposal
        self._room = self.k_max  # what the generation has left, as the last ``cap`` was told
        self._proposal: list[int] = []  # this step's lookup proposal, untrimmed (what padding continues)
        self._step_depth: int | None = None
        self._lookups = False  # a lookup has proposed in this generation (a cascade: its passes set the size)

    def cap(self, drafter: Drafter, room: int) -> int:
        """How many tokens ``drafter`` may propose this step (``room``: what the generation has left). A lookup
        proposes all it can and is trimmed afterwards; a model drafter pays per token, so its length is chosen now."""
        self._room = room
        if room <= 0:
            return 0
        if drafter.lookup:
            self._lookups = True
            return min(room, self.k_max)
        k = self.best_k(drafter.name, drafter.name, room)
        # a device with pass shapes: ``pad`` fills the draft up to the pass's size (in a batch, the scheduler does)
        if k and self.keeps_size:
            if self.fixed is None:
                self._step_depth = k = self._model_depth(drafter.name, room, k)
            elif self._lookups:  # k as asked, in the pass a lookup's pinned k pads to (auto alternates the two)
                self._step_depth = self._pinned_size(k) - 1
            else:  # a model alone: k + 1 rows every pass is a steady size already
                self._step_depth = k
        return k

    def width(self, drafter: Drafter) -> int:
        """How many candidates ``drafter`` may offer: a lookup's are free to propose and verified as a tree, except
        on a device with pass shapes, where a tree's size (its nodes) leaves the kept sizes: replayed on the H100
        table, trees made grounded prompts slower than one chain (docs/performance-notes.md at 1a3f1f9, "Token
        trees on a GPU")."""
        return self.branches if drafter.lookup and not self.shapes.active else 1

    def trim(self, draft: Draft, drafter: Drafter) -> Draft:
        """Keep as much of a lookup's proposal as its kind has earned, as a chain or a tree of its first
        candidates; the whole proposal is learned in hindsight. Of a proposal's two sources (earlier requests' and
        the sequence's own: ``Draft.fallback``) the one whose kind has earned more goes first; the other is learned
        in hindsight too, and trimmed in its turn where the first is trimmed to nothing (not on a device with pass
        shapes, one sequence: each trim counts a step of the kept pass sizes there)."""
        if not drafter.lookup or not draft.tokens:
            return draft
        first, second = self._ranked(draft)
        trimmed = self._trim(first)
        if second is not None:
            if not trimmed.tokens and not self.keeps_size:
                return self._trim(second)
            self._watched.append(Watched([second.tokens], [self._survival_of(second.kind)], after=self._after))
        return trimmed

    def _ranked(self, draft: Draft) -> tuple[Draft, Draft | None]:
        """The proposal's sources, the one whose kind expects more of its tokens accepted first (a tie: the
        drafter's order). On a GPU every lookup draft is verified at the kept pass size whatever its kind has
        earned, so which source leads is what decides there: earlier requests' 1-token matches, leading on the
        built-in suite as one job, made 2 of 284 drafted tokens (H100, 2026-11-27)."""
        other = draft.fallback
        if other is None or not other.tokens:
            return draft, None

        def worth(d: Draft) -> float:
            n = min(len(d), self.k_max)
            return self._survival_of(d.kind).expected_accepted(n)[n]

        return (other, draft) if worth(other) > worth(draft) else (draft, other)

    def _trim(self, draft: Draft) -> Draft:
        candidates = draft.candidates
        survivals = [self._survival_of(_wide(draft.kind, w)) for w in range(1, len(candidates) + 1)]
        depths = self.depths if self.keeps_size else None
        if depths is not None:
            depths.record()
        self._watched.append(Watched(candidates, survivals, depths=depths,
                                      born=depths.steps if depths is not None else 0, after=self._after))
        self._proposal = candidates[0]
        if depths is not None:
            self._step_depth = self._depth(draft)  # the pass's size for this step, chosen once (``pad`` uses it)
            self._trimmed = draft.trimmed(self._step_depth)
        else:
            self._trimmed = draft.trimmed(*self._shape(draft, candidates))
        return self._trimmed

    def _rate_seconds(self, rows: int) -> float:
        return self.costs(rows) if self.costs.known() else float(rows)

    def _shape(self, draft: Draft, candidates: list[list[int]]) -> tuple[int, int]:
        """(depth k, width w): a tree of the first w candidates cut to k tokens, for the most expected tokens per
        second. Its cost is that of a pass over its nodes, so shared prefixes come almost free."""
        k = self.best_k(draft.kind, draft.drafter, len(draft), watched=True)
        if len(candidates) == 1 or not self.costs.known():
            return k, 1
        depth = min(max(len(c) for c in candidates), self.k_max)
        sizes = trie_sizes(candidates, depth)
        chain = self._survival_of(draft.kind).expected_accepted(k)[k]
        best, best_rate = (k, 1), self._rate(1.0 + chain, 1 + k) * _TREE_MARGIN
        depths = range(1, depth + 1) if self.fixed is None else [min(self.fixed, depth)]
        for w in range(2, len(candidates) + 1):
            survival = self._survival_of(_wide(draft.kind, w))
            # only as deep as this width has been seen: past that its estimate is the last seen position's, again
            # and again, and one deep tree that fails costs a long pass for nothing
            seen = next((j for j, n in enumerate(survival.reached) if n < _TREE_EVIDENCE), len(survival.reached))
            expected = survival.expected_accepted(depth)
            for d in depths:
                if d > seen:
                    break
                nodes = sizes[w - 1][d]
                if nodes > self.k_max:
                    break
                if nodes == sizes[w - 2][d]:
                    continue  # the w-th candidate adds nothing this deep
                rate = self._rate(1.0 + expected[d], 1 + nodes)
                if rate > best_rate:
                    best, best_rate = (d, w), rate
                    self.expected = 1.0 + expected[d]
        return best

    def _survival_of(self, kind: str) -> Survival:
        record = self.shared if kind.startswith(CACHE_KIND) \
            else self.predicted if kind.startswith(PREDICTION_KIND) else self.learned
        survival = record.get(kind)
        if survival is None:
            survival = record[kind] = Survival()
        return survival

    @property
    def calibrated(self) -> bool:
        return bool(self.costs.calibrated)

    def calibrate(self, verify_seconds: Mapping[int, float]) -> None:
        """Seed the pass-cost curve with measured seconds per batch size; every pass keeps correcting it (not a
        reproducible policy's: it prices on these figures alone)."""
        self.costs = PassCosts(dict(verify_seconds), frozen=self.reproducible)

    def _rate(self, tokens: float, rows: int, draft_seconds: float = 0.0) -> float:
        """Tokens per second of the whole pass when this sequence adds ``rows`` rows expected to emit ``tokens``
        (after any forced tokens that lead it)."""
        other_rows, other_tokens = self.others
        lead = len(self._after)  # forced tokens: rows of this pass, each counted as accepted
        return (other_tokens + lead + tokens) / (self.costs(other_rows + lead + rows) + draft_seconds)

    def follow(self, forced: Sequence[int]) -> None:
        """This step's drafts are proposed after ``forced``, the tokens a grammar forced (() after the step): they
        are priced as what they add to the pass those tokens fill (on a CPU a pass of 1 + f rows that also verifies
        k more costs less than k single rows more: priced as if alone, lookups were trimmed away where they paid),
        and a lookup's proposal is scored from where it begins, not against the forced tokens before it."""
        self._after = tuple(forced)

    def calibrate_drafter(self, drafter: str, seconds_per_token: float) -> None:
        """Seed a model drafter's cost per drafted token, so a drafter too slow to pay is never tried."""
        self._drafter_calibration[drafter] = seconds_per_token
        self._draft_cost.setdefault(drafter, seconds_per_token)

    def best_k(self, kind: str, drafter: str, limit: int | None = None, *, watched: bool = False) -> int:
        """The k that maximises expected tokens per second for drafts of ``kind`` (``watched``: learned in
        hindsight, so never worth a probe)."""
        cap = self.k_max if limit is None else min(limit, self.k_max)
        self.expected = 1.0
        if self.fixed is not None:
            return min(self.fixed, cap)
        if cap <= 0:
            return 0
        if not self.costs.known():
            return min(_PROBE_K, cap)  # nothing measured yet: a modest draft measures the costs
        expected = self._survival_of(kind).expected_accepted(cap)
        d = self._draft_cost.get(drafter, 0.0)
        plain = self._rate(1.0, 1)
        best_k, best_rate = 0, plain
        for k in range(1, cap + 1):
            rate = self._rate(1.0 + expected[k], 1 + k, k * d)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            if watched:
                return 0  # a probe would pay to learn what the proposal teaches for free
            if not any(self._rate(1.0 + _ceiling(k, d), 1 + k, k * d) > plain * (_MODEL_PROBE_GAIN if d else 1.0)
                       for k in range(1, cap + 1)):
                return 0  # even a draft as right as drafts get costs more than it saves: never probe
            waited = self._plain_steps.get(kind, 0) + 1
            self._plain_steps[kind] = waited
            patience = self._patience.get(kind, _PROBE_EVERY)
            if waited >= patience:
                # each probe that does not win the drafter back doubles the wait for the next one
                self._plain_steps[kind] = 0
                self._patience[kind] = min(2 * patience, _PROBE_EVERY_MAX)
                return min(_PROBE_K, cap)
            return 0
        self._patience.pop(kind, None)
        self.expected = 1.0 + expected[best_k]
        return best_k

    def observe(
        self, draft: Draft, accepted: int, draft_seconds: float, verify_seconds: float, emitted: Sequence[int],
        nodes: int | None = None, *, priced: bool = True,
    ) -> None:
        """One step's outcome; ``emitted`` are the tokens it produced (accepted draft tokens, then the target's);
        ``nodes``: the draft tokens the pass verified, where a tree's candidates shared some. ``priced``: the pass
        was this sequence's alone, so its seconds are what its rows cost (a batch prices its shared passes itself)."""
        drafted, drafter = len(draft), draft.drafter
        rows = (drafted if nodes is None else nodes) + 1
        drafted -= draft.filler  # a model's short draft padded: what it proposed is what it is judged on
        # on a device with pass shapes only a steady pass says what its size costs: a change is priced apart
        steady = not self.shapes.active or self.warmup.step(rows) == STEADY
        if priced and steady:
            self.costs.update(rows, verify_seconds)
        # a grammar's forced tokens lead the draft and are never trimmed (nothing would read what they are worth:
        # they cost rows the pass has anyway), so only what the drafter proposed after them (``own``) is learned,
        # as the drafter's, from where it began
        forced = min(draft.forced, drafted)
        own = drafted - forced if accepted >= forced else 0  # a forced token refused: the rest was never reached
        if own and not self._watched_rest(draft):  # a trimmed proposal is scored in hindsight, not twice
            self._survival_of(draft.kind).update(accepted - forced, own)
        self._trimmed = None
        self._proposal, self._step_depth = [], None  # the step is over: nothing of it pads the next one
        self._watched = [w for w in self._watched if not w.advance(emitted)]
        # a lookup costs about the same whatever its length (tens of µs): only a model drafter pays per token, and
        # only for the tokens it drafted
        if own and drafter in self._drafter_calibration and not self.reproducible:
            per_token = draft_seconds / own
            old = self._draft_cost.get(drafter)
            self._draft_cost[drafter] = per_token if old is None else DECAY * old + (1 - DECAY) * per_token

    def _watched_rest(self, draft: Draft) -> bool:
        """The draft is this step's trimmed lookup proposal, which its Watched scores: as trimmed, or as a grammar
        left it (forced tokens before it, its tail cut where the grammar forbids it)."""
        trimmed = self._trimmed
        if draft is trimmed:
            return True
        return (trimmed is not None and bool(trimmed.tokens) and draft.drafter == trimmed.drafter
                and draft.kind == trimmed.kind)

    def plain_seconds_per_token(self) -> float:
        """What one plain decoding step costs on the corrected curve (0 before anything was measured)."""
        return self.costs(1) if self.costs.known() else 0.0


def _ceiling(k: int, seconds_per_token: float) -> float:
    """The most tokens a k-token draft can be expected to have accepted: all of a lookup's (it costs nothing to be
    wrong), a model's as far as it agrees at best (_MODEL_PROBE_AGREEMENT)."""
    if not seconds_per_token:
        return float(k)
    a = _MODEL_PROBE_AGREEMENT
    return a * (1 - a**k) / (1 - a)


def _wide(kind: str, width: int) -> str:
    """The kind under which the best of a proposal's first ``width`` candidates is learned."""
    return kind if width == 1 else f"{kind}×{width}"
