"""The adaptive draft-length chooser: what it learns from, and what it then picks."""

from __future__ import annotations

from dataclasses import replace

from localspec.drafters.base import Draft
from localspec.speculative.adaptive import AdaptiveK

# seconds per target pass by batch size, shaped like the CPU measurements (multiples of 4 are cheap)
COSTS = {1: 0.012, 2: 0.023, 3: 0.028, 4: 0.030, 5: 0.048, 6: 0.050, 7: 0.058, 8: 0.042,
         9: 0.058, 10: 0.063, 11: 0.066, 12: 0.055, 13: 0.070, 14: 0.076, 15: 0.078, 16: 0.066, 17: 0.084}
PASSAGE = list(range(100, 164))


def chooser() -> AdaptiveK:
    c = AdaptiveK(k_max=16)
    c.calibrate(COSTS)
    return c


def copy_steps(c: AdaptiveK, k: int, steps: int, *, watch: bool) -> None:
    """Steps of a drafter copying PASSAGE correctly, each drafting only k of its 16 proposed tokens."""
    pos = 0
    for _ in range(steps):
        proposal = Draft(PASSAGE[pos : pos + 16], None, "ngram", "ngram/4+", watched=watch)
        if watch:
            c.watch(proposal)
        emitted = PASSAGE[pos : pos + k + 1]  # k accepted, then the target's own (also the passage's) token
        c.observe(proposal.trimmed(k), k, 0.0, COSTS[k + 1], emitted)
        pos += k + 1


def plain_step(c: AdaptiveK, emitted: int) -> None:
    c.observe(Draft(), 0, 0.0, COSTS[1], [emitted])


def test_hindsight_on_whole_proposals_earns_long_drafts() -> None:
    # one copy broke at its fourth token; after that, drafts verified 3 at a time never test the fourth position
    # again, so without hindsight the chooser stays at 3; with it, every proposal shows 16 matching tokens
    learned, blind = chooser(), chooser()
    broken = Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/4+")
    learned.watch(broken)
    learned.observe(replace(broken, watched=True), 3, 0.0, COSTS[9], [1, 2, 3, 99])
    blind.observe(broken, 3, 0.0, COSTS[9], [1, 2, 3, 99])
    copy_steps(learned, 3, 12, watch=True)
    copy_steps(blind, 3, 12, watch=False)
    assert learned.best_k("ngram/4+", "ngram") == 15  # a 16-token pass: the cheapest per token when all match
    assert blind.best_k("ngram/4+", "ngram") < 15


def test_proposals_seen_during_plain_steps_start_drafting() -> None:
    c = chooser()
    assert c.best_k("ngram/4+", "ngram") == 0  # nothing known: a plain step is the better bet
    copy_steps(c, 0, 40, watch=True)  # plain steps only, while the proposals kept coming true
    assert c.best_k("ngram/4+", "ngram") > 0


def test_a_proposal_that_goes_wrong_teaches_where() -> None:
    c = chooser()
    for _ in range(20):
        c.watch(Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/2"))
        for token in (1, 2, 99):  # plain steps; the copy always breaks at its third token
            plain_step(c, token)
    # two tokens are all it ever gets right: never a draft longer than that, and no probe of 3
    assert c.best_k("ngram/2", "ngram", watched=True) <= 2


def test_pending_proposals_do_not_outlive_their_generation() -> None:
    c = chooser()
    c.watch(Draft(PASSAGE[:16], None, "ngram", "ngram/4+"))
    c.restart()
    for token in PASSAGE[:16]:  # would have confirmed all 16
        plain_step(c, token)
    fresh = chooser()
    assert c.best_k("ngram/4+", "ngram") == fresh.best_k("ngram/4+", "ngram")


def test_a_drafter_that_cannot_pay_is_never_probed() -> None:
    c = chooser()
    c.calibrate_drafter("draft", 0.5)  # half a second per drafted token: no acceptance rate pays for that
    assert all(c.best_k("draft", "draft") == 0 for _ in range(300))


def test_fixed_k_is_kept_within_the_room() -> None:
    c = AdaptiveK(fixed=5)
    assert c.best_k("ngram/1", "ngram") == 5
    assert c.best_k("ngram/1", "ngram", limit=2) == 2
