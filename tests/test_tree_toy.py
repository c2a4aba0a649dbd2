"""Token trees, exactly: against the batch-invariant toy model, verifying several candidates at once must not change
one token, greedy or seeded-sampled, for trees of every shape; and the policy branches only where passes are cheap."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from localspec.drafters.base import Draft
from localspec.drafters.ngram import NgramDrafter
from localspec.events import Finished, Step
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.loop import Generator
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.tree import TokenTree, trie_sizes
from tests.toy import EOS, VOCAB, ToyContext, ToyModel, plain_greedy

TARGET = ToyModel(seed=1)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 4], [10, 11, 10, 11, 10, 11, 12], [42]]
GREEDY = SamplingSettings(temperature=0.0)
SAMPLED = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)


class ScriptedTrees:
    """Proposes ``width`` candidates of ``depth`` tokens: each follows the target's greedy continuation for a random
    number of tokens, then goes astray, so candidates share prefixes, and the right one is sometimes not the first.
    Not a lookup: the policy takes its trees as they are."""

    name = "scripted"
    lookup = False

    def __init__(self, width: int, depth: int, seed: int) -> None:
        self.width, self.depth = width, depth
        self.rng = np.random.default_rng(seed)

    def begin(self, history: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        depth = min(self.depth, cap)
        truth = plain_greedy(TARGET, history, depth)
        truth += [int(t) for t in self.rng.integers(1, VOCAB, depth - len(truth))]
        candidates = []
        for _ in range(self.width):
            right = int(self.rng.integers(0, depth + 1))
            candidates.append(truth[:right] + [int(t) for t in self.rng.integers(1, VOCAB, depth - right)])
        return Draft(candidates[0], None, self.name, self.name, tuple(candidates[1:]))

    def accept(self, history: Sequence[int], n_accepted: int, verified: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def generate(drafters: list, prompt: list[int], policy: DraftPolicy, sampling: SamplingSettings = GREEDY,
             max_tokens: int = 50) -> tuple[list[int], list[Step], ToyContext, Finished]:
    ctx = ToyContext(TARGET)
    gen = Generator(ctx, TARGET, drafters, sampling, policy)  # type: ignore[arg-type]
    events = list(gen.generate(prompt, GenerationSettings(max_tokens=max_tokens)))
    steps = [e for e in events if isinstance(e, Step)]
    finished = events[-1]
    assert isinstance(finished, Finished)
    return [t.id for s in steps for t in s.emitted], steps, ctx, finished


SHAPES = [(w, d) for w in range(1, 5) for d in range(1, 5)] + [(2, 8), (4, 12)]


@pytest.mark.parametrize(("width", "depth"), SHAPES)
def test_trees_of_every_shape_give_exactly_the_plain_greedy_text(width: int, depth: int) -> None:
    for seed, prompt in enumerate(PROMPTS):
        expected = plain_greedy(TARGET, prompt, 50)
        drafter = ScriptedTrees(width, depth, seed)
        got, steps, ctx, finished = generate([drafter], prompt, DraftPolicy(k_max=16, fixed=depth))
        assert got == expected, f"{width}x{depth} prompt={prompt}"
        # the cache holds exactly the accepted history but the pending token, whichever branch won
        assert ctx.tokens == (prompt + got)[:-1]
        assert all(1 <= s.branches <= width for s in steps)
        # every verified node is counted once: accepted, rejected on the winning branch, or on another branch
        assert finished.stats.drafted == sum(s.k for s in steps if s.target is not None)
        if width > 1:
            assert ctx.tree_passes > 0 and finished.stats.tree_passes == ctx.tree_passes
            assert any(s.rejected_branches for s in steps)


@pytest.mark.parametrize(("width", "depth"), [(2, 2), (3, 4), (4, 4)])
def test_seeded_sampling_with_trees_gives_exactly_the_plain_sampled_text(width: int, depth: int) -> None:
    """One-hot candidates: each node is checked against the token drawn from p with its position's own stream,
    so the text is the seed's, whichever branch wins."""
    for seed, prompt in enumerate(PROMPTS):
        plain, _, _, _ = generate([], prompt, DraftPolicy(), SAMPLED)
        got, steps, ctx, _ = generate([ScriptedTrees(width, depth, seed)], prompt, DraftPolicy(fixed=depth), SAMPLED)
        assert got == plain
        assert ctx.tree_passes > 0 and ctx.logit_passes > 0


def test_ngram_with_branches_on_a_repetitive_prompt_is_lossless() -> None:
    """The real n-gram drafter offering several candidates, a policy that finds wide passes free: whatever shapes
    it picks, the text is the target's, and every width was learned from the proposals."""
    prompt = [5, 6, 7, 8, 5, 6, 9, 10, 5, 6, 7, 11, 5, 6, 9, 12, 5, 6]
    policy = DraftPolicy(k_max=8, fixed=3, branches=4)
    policy.calibrate({n: 0.001 for n in range(1, 18)})
    got, steps, ctx, _ = generate([NgramDrafter()], prompt, policy, max_tokens=80)
    assert got == plain_greedy(TARGET, prompt, 80)
    assert ctx.tokens == (prompt + got)[:-1]
    assert any(kind.endswith("×2") for kind in policy.learned)


def test_token_tree_merges_shared_prefixes_and_walks_as_the_target_goes() -> None:
    tree = TokenTree.of([[1, 2, 3], [1, 4], [5], [1, 2]])  # the last adds nothing: a prefix of the first
    assert tree.tokens == (1, 2, 3, 4, 5)
    assert tree.parents == (-1, 0, 1, 0, -1)
    assert tree.branches == 3
    assert tree.path(3) == [0, 3]
    # the target says 1 after the root, then 4 after node 0 (row 1), then 9 after node 3 (row 4)
    answers = {0: 1, 1: 4, 4: 9}
    assert tree.walk(lambda row, depth: answers[row]) == ([0, 3], 9)
    tail, others = tree.rejected([0, 3])
    assert tail == [] and others == [[1, 2], [4]]
    assert tree.rejected([]) == ([0, 1, 2], [[3], [4]])
    assert TokenTree.of([[7, 8, 9]]).branches == 1 and TokenTree.of([]).branches == 1
    # sizes[w-1][k]: nodes of the first w candidates cut to depth k
    assert trie_sizes([[1, 2, 3], [1, 4], [5]], 3) == [[0, 1, 2, 3], [0, 1, 3, 4], [0, 2, 4, 5]]


def _teach(policy: DraftPolicy, costs: dict[int, float], rounds: int) -> None:
    """Proposals of two candidates where the first is right half of the time and the second the other half; each
    pass costs what ``costs`` says."""
    drafter = NgramDrafter()
    for i in range(rounds):
        right, wrong = [1, 2, 3, 4], [1, 9, 9, 9]
        first, second = (right, [1, 2, 7, 7]) if i % 2 else (wrong, right)
        trimmed = policy.trim(Draft(first, None, "ngram", "ngram/2", (second,)), drafter)
        nodes = len(TokenTree.of(trimmed.candidates))
        policy.observe(trimmed, 0, 0.0, costs[nodes + 1] / 1000, [1, 2, 3, 4, EOS], nodes)


def test_the_policy_branches_where_passes_are_cheap_and_not_where_they_are_linear() -> None:
    h100 = {1: 1.10, 2: 1.33, 3: 1.63, 4: 1.67, 5: 1.88, 6: 1.81, 7: 1.97, 8: 2.07, 9: 3.21}
    linear = {n: float(n) for n in range(1, 18)}
    shapes = {}
    for name, costs in (("h100", h100), ("linear", linear)):
        policy = DraftPolicy(k_max=16, branches=4)
        policy.calibrate({n: s / 1000 for n, s in costs.items()})
        _teach(policy, costs, 40)
        trimmed = policy.trim(Draft([1, 9, 9, 9], None, "ngram", "ngram/2", ([1, 2, 3, 4],)), NgramDrafter())
        shapes[name] = (len(trimmed.candidates), len(trimmed))
    assert shapes["h100"][0] == 2, shapes  # the second candidate is worth its nodes
    assert shapes["linear"][0] <= 1, shapes  # every node costs a pass's worth: one chain, or nothing


def test_trimming_a_draft_cuts_every_candidate_it_keeps() -> None:
    """The first candidate is often the shortest (a followed source running into the end of the history): the
    others must still be cut to the chosen depth, or the tree holds more nodes than the policy priced."""
    draft = Draft([1, 2], None, "ngram", "ngram/1", ([3, 4, 5, 6], [7, 8, 9]))
    assert draft.trimmed(3, 2).others == ([3, 4, 5],)
    assert draft.trimmed(3, 3).others == ([3, 4, 5], [7, 8, 9])
    assert draft.trimmed(8, 3) is draft and draft.trimmed(2, 1).others == ()


class Extending(ScriptedTrees):
    """A short first candidate and a second that goes on from it: together, one longer chain."""

    def propose(self, history: Sequence[int], cap: int, width: int = 1) -> Draft:
        truth = plain_greedy(TARGET, history, 5)
        return Draft(truth[:2], None, self.name, self.name, (truth,))


def test_candidates_that_extend_one_another_are_verified_as_their_whole_chain() -> None:
    prompt = PROMPTS[1]
    got, steps, ctx, _ = generate([Extending(2, 5, 0)], prompt, DraftPolicy(fixed=5), max_tokens=30)
    assert got == plain_greedy(TARGET, prompt, 30)
    assert ctx.tree_passes == 0  # one chain, no tree
    assert steps[0].k == 5 and len(steps[0].accepted) == 5  # the whole chain, not the first candidate's 2
