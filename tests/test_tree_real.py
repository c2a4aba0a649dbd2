"""Token trees on the real model through the real llama.cpp: the KV cache keeps exactly the accepted path, a tree
row attends to its ancestors only, a tree pass's argmax is the argmax of its own logits and of the same path decoded
as a chain, and generating with trees is lossless (every emitted token the argmax of the pass that verified it).

llama.cpp's numerics depend on the batch's size and on where in the cache each cell sits, so logits are compared
with tolerances measured here (Gemma 3 270M Q4_K_M, CPU, 10 seeds): after 25 random trees, the next logits differ
from a fresh context's fed the same tokens by ≤ ~1.1 (max |Δ| less the median Δ, see ``shifted_diff``; raw max |Δ|
≤ ~2.2), and from a fresh context's fed one kept token's sibling instead by ≥ ~3 (≥ 3.4x the first). The raw max |Δ|
does not separate the two (wrong paths measured as low as 2.3): it is shifted_diff that the test bounds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localspec.drafters.base import Draft, Drafter
from localspec.engine import Context, Model
from localspec.events import Finished, Step
from localspec.runtime import Runtime
from localspec.settings import (
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.tree import TokenTree
from tests.lossless import assert_lossless, margin

GREEDY = SamplingSettings()
ROWS = 17  # greedy_rows: pending + 16 nodes, what a k_max of 16 verifies
N_SEQ = 4
SAME = 2.0  # shifted_diff between the tree context and a fresh one fed the same tokens (measured ≤ 1.1)
FARTHER = 2.5  # ... and a fresh context fed a wrong path at least this many times farther (measured ≥ 3.4x)
# a tree row's argmax may differ from the chain's only where the chain rates it this close to its own best: the tree
# runs in batches of another size over a history its trees left in other cells (measured over 11 seeds: ≤ 0.72; the
# rows after random vocabulary ids are the noisiest)
CHAIN_TIE = 1.0
# bit-identical on the CPU (the mask gives masked cells exactly no weight); a margin for other backends' kernels
EXACT = 1e-3
PROMPT = "The history of the lighthouse begins in the year 1820, when a small fishing village on the coast"


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[Model]:
    with Model(model_path) as m:
        yield m


def trie(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[list[int]]]:
    """A pass's rows for ``candidates`` merged on shared prefixes: tokens and parents ([pending] not included:
    node i is row i + 1, its parent row ``parents[i]``, 0 for the pending token), and each candidate's rows."""
    tree = TokenTree.of(candidates)
    ends = {tuple(tree.tokens[m] for m in tree.path(n)): n for n in range(len(tree))}
    paths = [[n + 1 for n in tree.path(ends[tuple(c)])] if c else [] for c in candidates]
    return list(tree.tokens), [parent + 1 for parent in tree.parents], paths


def fits(candidates: Sequence[Sequence[int]]) -> bool:
    """At most ROWS - 1 nodes (with the pending token, a pass of at most ROWS rows) and N_SEQ leaves."""
    _, parents, _ = trie(candidates)
    return len(parents) < ROWS and len(parents) - len(set(parents) - {0}) <= N_SEQ


def random_candidates(rng: np.random.Generator, pool: Sequence[int], n_vocab: int) -> list[list[int]]:
    """1-4 candidates of depth 1-5, tokens from the vocabulary or the prompt, often sharing a prefix with an earlier
    one (sometimes all of it: a duplicate or a prefix adds no node); a tree that ``fits``."""
    depth = int(rng.integers(1, 6))
    candidates: list[list[int]] = []
    for _ in range(int(rng.integers(1, 5))):
        length = int(rng.integers(1, depth + 1))
        shared: list[int] = []
        if candidates and rng.random() < 0.6:
            earlier = candidates[int(rng.integers(0, len(candidates)))]
            shared = earlier[: int(rng.integers(0, len(earlier) + 1))]
        candidate = shared[:length]
        while len(candidate) < length:
            candidate.append(int(rng.choice(pool)) if rng.random() < 0.5 else int(rng.integers(0, n_vocab)))
        if not fits([*candidates, candidate]):
            break
        candidates.append(candidate)
    return candidates


def path_to(parents: Sequence[int], row: int) -> list[int]:
    """The rows from the pending token (row 0) down to ``row``; ``parents`` as a pass takes them (parents[0] = -1)."""
    rows = []
    while row >= 0:
        rows.append(row)
        row = parents[row]
    return rows[::-1]


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def shifted_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max |Δlogit| over the vocabulary, less the median Δ: llama.cpp's numerics often shift every logit alike (no
    change to the distribution), by up to ~1 here; a wrong history moves logits apart instead."""
    d = a - b
    return float(np.abs(d - np.median(d)).max())


def next_logits(model: Model, tokens: Sequence[int], probe: int) -> np.ndarray:
    """The logits after ``tokens`` + ``probe`` in a fresh context: prefill in one batch, then the probe alone."""
    with Context(model, n_ctx=512) as fresh:
        fresh.feed(tokens)
        return fresh.decode([probe])[-1].copy()


def test_the_cache_holds_exactly_the_kept_paths_after_many_random_trees(model: Model) -> None:
    """25 random trees, each followed by keep_path of a random path: the cache mirrors the kept tokens, no other
    sequence keeps a cell, and the next token's logits are those of a fresh context fed the same tokens (within
    the numerics), far from those of a fresh context fed a sibling instead of the last kept token."""
    rng = np.random.default_rng(7)
    prompt = model.vocab.tokenize(PROMPT, add_special=True)
    n_vocab = model.vocab.n_tokens
    with Context(model, n_ctx=512, greedy_rows=ROWS, n_seq=N_SEQ) as ctx:
        memory = llama_cpp.llama_get_memory(ctx.handle)
        ctx.feed(prompt)
        expected = list(prompt)
        pending = int(rng.choice(prompt))
        checks, branched, off_first = [], 0, 0
        for step in range(1, 26):
            check = step % 8 == 0 or step == 25
            candidates = random_candidates(rng, prompt, n_vocab)
            if check:  # a known wrong path: the kept node's sibling, one token away from the right history
                keep = candidates[0]
                sibling = int(rng.choice(prompt))
                while sibling == keep[-1]:
                    sibling = int(rng.choice(prompt))
                candidates = [keep, [*keep[:-1], sibling]]
            nodes, node_parents, paths = trie(candidates)
            tokens, parents = [pending, *nodes], [-1, *node_parents]
            ids = ctx.decode_tree_argmax(tokens, parents)
            assert len(ids) == len(tokens) and all(0 <= t < n_vocab for t in ids)
            rows = [0, *paths[0]] if check else path_to(parents, int(rng.integers(0, len(tokens))))
            ctx.keep_path(rows)
            expected += [tokens[r] for r in rows]
            assert ctx.tokens == expected
            assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == len(expected) - 1
            assert llama_cpp.llama_memory_seq_pos_min(memory, 0) == 0
            for s in range(1, N_SEQ):  # the other branches are gone, whichever won
                assert llama_cpp.llama_memory_seq_pos_max(memory, s) == -1, (step, s)
            branched += len(set(parents[1:])) < len(parents) - 1
            off_first += rows[-1] != len(rows) - 1  # the first candidate's nodes are rows 1, 2, ...
            # the next pending token: the target's own (as the loop does; always before a check) or any token
            pending = ids[rows[-1]] if check or rng.random() < 0.5 else int(rng.integers(0, n_vocab))
            if not check:
                continue
            got = ctx.decode([pending])[-1].copy()  # a logits pass on the tree context, then trees again
            want = next_logits(model, expected, pending)
            wrong = next_logits(model, [*expected[:-1], sibling], pending)
            same, off = shifted_diff(got, want), shifted_diff(got, wrong)
            checks.append((step, same, off))
            assert same < SAME and off > FARTHER * same, checks
            expected.append(pending)
            pending = int(got.argmax())
        assert branched >= 5 and off_first >= 3, (branched, off_first)  # kept paths off branch 0 too

        # both caches go on to the same greedy text (the tree context through its backend sampler, one at a time)
        with Context(model, n_ctx=512) as fresh:
            fresh.feed(expected)
            mine, theirs, gaps = [], [], []
            a = b = pending
            for _ in range(20):
                a = ctx.decode_argmax([a])[0]
                row = fresh.decode([b])[-1]
                b = int(row.argmax())
                top2 = np.sort(row)[-2:]
                mine.append(a)
                theirs.append(b)
                gaps.append(float(top2[1] - top2[0]))
        if mine != theirs:  # a divergence only at a near-tie of the fresh context's top-2
            j = next(i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y)
            assert gaps[j] < checks[-1][1], (j, gaps[j], checks)
        assert len(ctx.tokens) == len(expected) + 20


def test_a_tree_pass_argmax_is_numpys_argmax_and_the_chains(model: Model) -> None:
    """Backend-sampled argmax of every row = numpy's argmax of the same tree's logits (another context, the same
    passes); and, up to the numerics at a near-tie, the argmax after the row's path decoded as a plain chain."""
    rng = np.random.default_rng(11)
    prompt = model.vocab.tokenize("Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list:\n",
                                  add_special=True)
    n_vocab = model.vocab.n_tokens
    with (Context(model, n_ctx=512, greedy_rows=ROWS, n_seq=N_SEQ) as sampled,
          Context(model, n_ctx=512, n_seq=N_SEQ, n_batch=64) as plain, Context(model, n_ctx=512) as chain):
        assert sampled.backend_sampling and not plain.backend_sampling
        for ctx in (sampled, plain, chain):
            ctx.feed(prompt[:-1])
        history, pending = prompt[:-1], prompt[-1]
        compared, near_ties = 0, []
        for _ in range(4):
            # the target's own continuation (rows the model would accept), a branch off it, random ones
            greedy, t = [], pending
            for _ in range(4):
                t = int(chain.decode([t])[-1].argmax())
                greedy.append(t)
            chain.truncate(len(history))
            candidates = [greedy, [*greedy[:2], int(rng.integers(0, n_vocab))]]
            for candidate in random_candidates(rng, prompt, n_vocab):
                if fits([*candidates, candidate]):
                    candidates.append(candidate)
            nodes, node_parents, _ = trie(candidates)
            tokens, parents = [pending, *nodes], [-1, *node_parents]
            ids = sampled.decode_tree_argmax(tokens, parents)
            logits = plain.decode_tree(tokens, parents).copy()
            for r, token in enumerate(ids):
                best = int(logits[r].argmax())
                assert token == best or logits[r][token] == logits[r][best], r  # exact ties break either way
                own = chain.decode([tokens[x] for x in path_to(parents, r)])[-1]
                chain.truncate(len(history))
                if token != int(own.argmax()):  # the tree's choice must be (nearly) the chain's best too
                    near_ties.append(float(own.max() - own[token]))
                    assert near_ties[-1] <= CHAIN_TIE, (r, token, int(own.argmax()), near_ties)
                compared += 1
            # go on from a random node, all three contexts alike
            rows = path_to(parents, int(rng.integers(0, len(tokens))))
            sampled.keep_path(rows)
            plain.keep_path(rows)
            kept = [tokens[r] for r in rows]
            chain.feed(kept)
            history = [*history, *kept]
            assert sampled.tokens == plain.tokens == chain.tokens == history
            pending = ids[rows[-1]]
        assert compared >= 30 and len(near_ties) <= compared // 8, (compared, near_ties)


def test_a_tree_row_sees_its_ancestors_and_nothing_else(model: Model) -> None:
    """Exact, in passes of the same shape on identically fed contexts: a tree of one branch is the chain, and
    changing one node's token changes the rows of its subtree and leaves every other row as it was."""
    prompt = model.vocab.tokenize(PROMPT, add_special=True)
    tokens = [prompt[-1], 1437, 529, 506, 236743, 3890, 529, 107, 2094, 506]
    parents = [-1, 0, 1, 2, 3, 2, 5, 0, 7, 1]  # four branches: 0-1-2-3-4, 2-5-6, 0-7-8, 1-9

    with Context(model, n_ctx=512, n_seq=N_SEQ, n_batch=32) as ctx, Context(model, n_ctx=512) as chain:
        ctx.feed(prompt[:-1])
        chain.feed(prompt[:-1])

        def tree_logits(toks: Sequence[int], pars: Sequence[int]) -> np.ndarray:
            """The pass on the same cache each time: its cells are freed after it (checked: bit-identical again)."""
            logits = ctx.decode_tree(toks, pars).copy()
            ctx.keep_path([0])
            ctx.truncate(len(prompt) - 1)
            return logits

        path = path_to(parents, 4)
        as_chain = chain.decode([tokens[r] for r in path], all_logits=True)
        assert max_diff(tree_logits([tokens[r] for r in path], [-1, 0, 1, 2, 3]), as_chain) < EXACT
        base = tree_logits(tokens, parents)
        assert max_diff(tree_logits(tokens, parents), base) < EXACT
        for node in (2, 5, 7, 9):
            changed = list(tokens)
            changed[node] = 4000
            got = tree_logits(changed, parents)
            below = {r for r in range(len(tokens)) if node in path_to(parents, r)}
            for r in range(len(tokens)):
                diff = max_diff(got[r], base[r])
                if r in below:
                    assert diff > 1.0, (node, r, diff)
                else:
                    assert diff < EXACT, (node, r, diff)
        assert ctx.tokens == prompt[:-1]


class EveryCandidate(DraftPolicy):
    """The real policy, but every lookup draft is verified as a tree of all its candidates cut to ``fixed``
    tokens: on this CPU a pass over more nodes costs more, and the policy would seldom branch."""

    def trim(self, draft: Draft, drafter: Drafter) -> Draft:
        if not drafter.lookup or not draft.tokens:
            return super().trim(draft, drafter)
        k = self.fixed or 3
        return replace(draft, tokens=draft.tokens[:k], others=tuple(c[:k] for c in draft.others[: self.branches - 1]))


class RecordingTarget:
    """The real Context, forwarding everything; remembers each greedy verifying pass: (tokens, parents, ids)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.passes: list[tuple[list[int], list[int], list[int]]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.ctx, name)

    def decode_argmax(self, tokens: Sequence[int]) -> list[int]:
        ids = self.ctx.decode_argmax(tokens)
        self.passes.append((list(tokens), list(range(-1, len(tokens) - 1)), list(ids)))
        return ids

    def decode_tree_argmax(self, tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
        ids = self.ctx.decode_tree_argmax(tokens, parents)
        self.passes.append((list(tokens), list(parents), list(ids)))
        return ids

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        if all_logits:
            raise AssertionError("a greedy loop verified with logits")
        return self.ctx.decode(tokens)


# copying records in another order: at each record's end the passage followed so far goes on wrongly and an older
# occurrence is right, so the loop keeps paths off the first branch; the questions repeat prefixes with other answers
PROMPTS = [
    "Records:\nname: Alice Smith; city: Paris; code: A-1042; role: editor\n"
    "name: Bob Jones; city: Lyon; code: B-2210; role: writer\n"
    "name: Carol White; city: Nice; code: C-3305; role: editor\n"
    "name: Dan Brown; city: Lille; code: D-4471; role: writer\n"
    "Copy the records above exactly, in reverse order:\n",
    "Q: What is the capital of France? A: Paris.\nQ: What is the capital of Spain? A: Madrid.\n"
    "Q: What is the capital of Italy? A: Rome.\nQ: What is the capital of Germany? A: Berlin.\n"
    "Now the same questions in another order.\nQ: What is the capital of Spain? A:",
]


@pytest.mark.parametrize("sampler", [True, False], ids=["backend-sampler", "logits"])
def test_generating_with_trees_is_lossless_and_each_token_is_its_passes_argmax(model_path: Path, sampler: bool) -> None:
    spec = SpeculationSettings(drafter="ngram", k=3, branches=N_SEQ)  # a fixed k: no cost calibration at open
    # no history: the target-only text each prompt first generates would be drafted whole from it, every pass on
    # the first branch, and the trees this test walks would never leave it
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024), spec, GREEDY, history=HistorySettings("off"))
    with Runtime.open(settings) as rt:
        # both ways a device may read passes back (choose_reads picks one by timing)
        rt.context.use_backend_sampler(sampler)
        assert rt.context.n_seq == N_SEQ and rt.context.backend_sampling == sampler
        recorder = RecordingTarget(rt.context)
        rt.generator.target = recorder  # type: ignore[assignment]
        trees = off_first = 0
        for prompt in PROMPTS:
            tokens = rt.prompt_tokens(prompt)
            rt.set_drafter("ngram")
            rt.generator.policy = EveryCandidate(k_max=16, fixed=3, branches=N_SEQ)
            recorder.passes.clear()
            events = list(rt.generator.generate(tokens, GenerationSettings(max_tokens=60)))
            finished = events[-1]
            assert isinstance(finished, Finished)
            steps = [e for e in events if isinstance(e, Step)]
            got = [t.id for s in steps for t in s.emitted]
            trees += finished.stats.tree_passes
            assert finished.stats.tree_passes == sum(s.branches > 1 for s in steps)
            # the cache holds the history but its last token, whichever branches won
            assert rt.context.tokens == (tokens + got)[:-1]

            # every emitted token is the argmax its verifying pass returned, at the row of its parent (row 0 for the
            # first), and the walk stopped only where no child holds the target's token
            assert len(recorder.passes) == len(steps)
            for step, (batch, parents, ids) in zip(steps, recorder.passes):
                children = {(p, batch[r]): r for r, p in enumerate(parents) if r}
                assert step.k == len(batch) - 1 and (step.branches > 1) == (len(set(parents)) < len(parents))
                row = 0
                for i, token in enumerate(step.emitted):
                    assert token.id == ids[row], (step, i, row, ids)
                    if i < len(step.accepted):
                        row = children[(row, token.id)]
                if step.target is not None:
                    assert (row, step.target.id) not in children
                first = 0  # the first candidate's last row: its nodes are rows 1, 2, ...
                while first + 1 < len(parents) and parents[first + 1] == first:
                    first += 1
                off_first += row > first

            # lossless at every position, up to this device's margin between pass shapes
            assert_lossless(rt.model, tokens, got, margin(rt.model), label=prompt[:20])
        rt.generator.target = rt.context
        assert trees > 0 and off_first > 0, (trees, off_first)
