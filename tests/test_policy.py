"""The draft-length policy: what it learns from, and what it then lets drafters draft."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from localspec.drafters.base import Draft
from localspec.drafters.ngram import NgramDrafter
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.survival import DECAY, Survival

# seconds per target pass by batch size, shaped like the CPU measurements (multiples of 4 are cheap)
COSTS = {1: 0.012, 2: 0.023, 3: 0.028, 4: 0.030, 5: 0.048, 6: 0.050, 7: 0.058, 8: 0.042,
         9: 0.058, 10: 0.063, 11: 0.066, 12: 0.055, 13: 0.070, 14: 0.076, 15: 0.078, 16: 0.066, 17: 0.084}
PASSAGE = list(range(100, 164))
LOOKUP = NgramDrafter()


@dataclass
class ModelLike:
    """A drafter that pays per drafted token: the policy chooses its length before it proposes."""

    name: str = "draft"
    lookup: bool = False


def policy(**kw: object) -> DraftPolicy:
    p = DraftPolicy(k_max=16, **kw)  # type: ignore[arg-type]
    p.calibrate(COSTS)
    return p


def step(p: DraftPolicy, proposal: Draft, truth: list[int]) -> int:
    """One step as the loop runs it for a lookup: trim, verify against ``truth``, observe. Returns k."""
    draft = p.trim(proposal, LOOKUP)
    k = len(draft)
    accepted = next((i for i in range(k) if draft.tokens[i] != truth[i]), k)
    p.observe(draft if k else Draft(), accepted, 0.0, COSTS[k + 1], truth[: accepted + 1])
    return accepted


def copy_steps(p: DraftPolicy, steps: int, kind: str = "ngram/4+") -> None:
    """Steps of a lookup that copies PASSAGE correctly, proposing 16 tokens each time."""
    pos = 0
    for _ in range(steps):
        pos += step(p, Draft(PASSAGE[pos : pos + 16], None, "ngram", kind), PASSAGE[pos:]) + 1


def test_hindsight_on_whole_proposals_earns_long_drafts() -> None:
    # one copy broke at its fourth token. Drafts verified 3 at a time never test the fourth position again, so a
    # policy that learns only from verdicts stays short; trimmed proposals are scored in hindsight, all 16 tokens
    learned, blind = policy(), policy()
    step(learned, Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/4+"), [1, 2, 3, 99])
    blind.observe(Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/4+"), 3, 0.0, COSTS[9], [1, 2, 3, 99])
    copy_steps(learned, 12)
    pos = 0
    for _ in range(12):  # verdicts only, 3 tokens at a time
        blind.observe(Draft(PASSAGE[pos : pos + 3], None, "ngram", "ngram/4+"), 3, 0.0, COSTS[4], PASSAGE[pos:pos + 4])
        pos += 4
    assert learned.best_k("ngram/4+", "ngram") == 15  # a 16-token pass: the cheapest per token when all match
    assert blind.best_k("ngram/4+", "ngram") < 15


def test_proposals_seen_during_plain_steps_start_drafting() -> None:
    p = policy()
    first = Draft(PASSAGE[:16], None, "ngram", "ngram/4+")
    assert p.trim(first, LOOKUP).tokens == []  # nothing known: a plain step is the better bet
    p.observe(Draft(), 0, 0.0, COSTS[1], PASSAGE[:1])
    for pos in range(1, 40):  # plain steps, while the proposals kept coming true
        p.trim(Draft(PASSAGE[pos : pos + 16], None, "ngram", "ngram/4+"), LOOKUP)
        p.observe(Draft(), 0, 0.0, COSTS[1], PASSAGE[pos : pos + 1])
    assert len(p.trim(Draft(PASSAGE[40:56], None, "ngram", "ngram/4+"), LOOKUP)) > 0


def test_a_proposal_that_goes_wrong_teaches_where() -> None:
    p = policy()
    for _ in range(20):
        for token in (1, 2, 99):  # the copy always breaks at its third token
            step(p, Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/2"), [token])
    # two tokens are all it ever gets right: never a draft longer than that, and no probe of 3
    assert len(p.trim(Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "ngram", "ngram/2"), LOOKUP)) <= 2


def test_pending_proposals_do_not_outlive_their_generation() -> None:
    p = policy()
    p.trim(Draft(PASSAGE[:16], None, "ngram", "ngram/4+"), LOOKUP)
    p.restart()
    for token in PASSAGE[:16]:  # would have confirmed all 16
        p.observe(Draft(), 0, 0.0, COSTS[1], [token])
    assert p.best_k("ngram/4+", "ngram") == policy().best_k("ngram/4+", "ngram")


def test_a_model_drafter_is_capped_before_it_proposes_and_never_trimmed() -> None:
    p = policy()
    slow = ModelLike()
    p.calibrate_drafter("draft", 0.5)  # half a second per drafted token: no acceptance rate pays for that
    assert all(p.cap(slow, 16) == 0 for _ in range(300))  # never even probed
    fast = ModelLike("fast")
    p.calibrate_drafter("fast", 0.0001)
    caps = [p.cap(fast, 2) for _ in range(40)]  # unknown acceptance: plain steps, then a probe within the room
    assert 0 < max(caps) <= 2
    proposal = Draft(PASSAGE[:5], None, "fast", "fast")
    assert p.trim(proposal, fast) is proposal


def test_forced_tokens_are_never_priced_into_a_model_drafters_tokens_nor_learned_as_its() -> None:
    # a grammar forced 6 tokens, then the draft model proposed 2 in 0.02 s: 0.01 s a token, not 0.0025; the model's
    # acceptance is that of its own 2 (1 of them accepted); the forced tokens' is learned by no one (never read)
    p = policy()
    p.calibrate_drafter("draft", 0.005)
    p.observe(Draft([1, 2, 3, 4, 5, 6, 7, 8], None, "draft", "draft", forced=6), 7, 0.02, COSTS[9],
              [1, 2, 3, 4, 5, 6, 7, 99])
    assert p._draft_cost["draft"] == pytest.approx(DECAY * 0.005 + (1 - DECAY) * 0.01)
    assert "forced" not in p.learned
    assert p.learned["draft"].reached == [1.0, 1.0] and p.learned["draft"].accepted == [1.0, 0.0]


def test_a_lookup_after_forced_tokens_is_priced_as_what_it_adds_to_their_pass() -> None:
    # right 1 time in 2 at its first token: alone, 2 rows (0.023 s) for an expected 1.5 tokens lose to a plain step
    # (1 token in 0.012 s); after 2 forced tokens the pass holds 3 rows already (0.028 s for 3 tokens), and a 4th
    # row (0.030 s) for half a token more pays
    p = policy()
    for accepted in (True, False) * 20:
        p._survival_of("ngram/2").record(0, accepted)
    proposal = Draft(PASSAGE[:4], None, "ngram", "ngram/2")
    assert len(p.trim(proposal, LOOKUP)) == 0
    p.follow([7, 8])
    assert len(p.trim(proposal, LOOKUP)) >= 1
    p.follow(())
    assert len(p.trim(proposal, LOOKUP)) == 0


def test_a_lookup_may_propose_all_the_room_allows() -> None:
    p = policy()
    assert p.cap(LOOKUP, 40) == 16 and p.cap(LOOKUP, 3) == 3 and p.cap(LOOKUP, 0) == 0


def test_fixed_k_is_kept_within_the_room() -> None:
    p = DraftPolicy(fixed=5)
    assert len(p.trim(Draft(PASSAGE[:16], None, "ngram", "ngram/1"), LOOKUP)) == 5
    assert p.cap(ModelLike(), 2) == 2 and p.cap(ModelLike(), 9) == 5


def test_of_two_sources_the_one_that_earned_more_goes_first_and_both_keep_learning() -> None:
    p = policy()
    wrong = Draft([7, 7, 7, 7], None, "ngram", "cache/1")  # earlier requests' 1-token match: never right here
    pos = 0
    while pos < 40:
        right = Draft(PASSAGE[pos : pos + 8], None, "ngram", "ngram/4+")
        pos += step(p, replace(wrong, fallback=right), PASSAGE[pos:]) + 1
    # the drafter put the history's match first; the sequence's own is drafted, and the history's learned wrong
    draft = p.trim(replace(wrong, fallback=Draft(PASSAGE[pos : pos + 4], None, "ngram", "ngram/4+")), LOOKUP)
    assert draft.kind == "ngram/4+" and draft.tokens and draft.tokens == PASSAGE[pos : pos + len(draft)]
    assert p.best_k("cache/1", "ngram") == 0
    # a source that is drafted nowhere still learns in hindsight, and leads again where it comes true
    q = policy()
    pos = 0
    while pos < 40:
        mine = Draft([7, 7, 7, 7], None, "ngram", "ngram/1")
        near = Draft(PASSAGE[pos : pos + 8], None, "ngram", "cache/near1")
        pos += step(q, replace(mine, fallback=near), PASSAGE[pos:]) + 1
    near = Draft(PASSAGE[pos : pos + 4], None, "ngram", "cache/near1")
    assert q.trim(replace(Draft([7], None, "ngram", "ngram/1"), fallback=near), LOOKUP).kind == "cache/near1"


def test_a_job_passes_what_its_sequences_learned_of_earlier_requests_and_keeps_their_own_kinds_apart() -> None:
    shared: dict[str, Survival] = {}
    first = policy(shared=shared)
    copy_steps(first, 12)
    copy_steps(first, 12, "cache/4+")
    second = policy(shared=shared)  # the job's next sequence: a policy of its own, earlier requests' record shared
    k = first.best_k("cache/4+", "ngram")
    assert second.best_k("cache/4+", "ngram") == k > policy().best_k("cache/4+", "ngram")
    # a code prompt's long matches say nothing of a chat prompt's: the own kinds stay the sequence's
    fresh = policy().best_k("ngram/4+", "ngram")
    assert first.best_k("ngram/4+", "ngram") > second.best_k("ngram/4+", "ngram") == fresh
    assert set(shared) == {"cache/4+"}
