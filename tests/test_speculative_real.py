"""Speculation on the real model through the real llama.cpp: lossless within measured numerical noise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec.drafters.model import check_compatible
from localspec.engine import Context, Model
from localspec.engine.rewrite import copy_model
from localspec.errors import UserError
from localspec.events import Step
from localspec.runtime import Runtime
from localspec.sampling import Distribution, shape
from localspec.settings import GenerationSettings, RuntimeSettings, SamplingSettings, Settings, SpeculationSettings
from tests.lossless import assert_lossless, margin
from tests.stats_helpers import chi_square, chi_square_critical, told_apart, wrongs

GREEDY = SamplingSettings()
GROUNDED = [
    "Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
    "def add(a, b):\n    return a + b\n\n# The same function, renamed to plus:\ndef plus(a, b):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
]


class RecordingContext(Context):
    """A real Context that remembers the argmax of every row each verifying pass computed."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.verified: list[np.ndarray] = []

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        logits = super().decode(tokens, all_logits=all_logits)
        if all_logits:
            self.verified.append(logits.argmax(axis=1))
        return logits


@pytest.fixture(scope="module")
def runtime(model_path: Path):  # type: ignore[no-untyped-def]
    none = SpeculationSettings(drafter="none", exit_layer=12)  # early exit at 12 of 18: drafts the target takes
    rt = Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=2048), none, GREEDY))
    yield rt
    rt.close()


def generate(rt: Runtime, prompt: str, drafter: str, k: int | None, n: int = 48) -> tuple[list[int], list[Step]]:
    rt.set_drafter(drafter)
    rt.generator.policy.reset()
    rt.generator.policy.fixed = k
    steps = [e for e in rt.generator.generate(rt.prompt_tokens(prompt), GenerationSettings(max_tokens=n))
             if isinstance(e, Step)]
    return [t.id for s in steps for t in s.emitted], steps


@pytest.mark.parametrize("drafter,k", [("ngram", 4), ("ngram", None), ("auto", None), ("early-exit", 3)])
def test_greedy_output_is_lossless_at_every_position(runtime: Runtime, drafter: str, k: int | None) -> None:
    rt, drafted = runtime, 0
    for prompt in GROUNDED:
        tokens, steps = generate(rt, prompt, drafter, k)
        assert_lossless(rt.model, rt.prompt_tokens(prompt), tokens, margin(rt.model), label=drafter)
        drafted += sum(len(s.accepted) + len(s.rejected) for s in steps)
    assert drafted > 0, f"{drafter} proposed nothing: the check saw only target-only decoding"


def test_the_lossless_check_fails_on_a_text_with_one_wrong_token(runtime: Runtime) -> None:
    rt = runtime
    prompt = rt.prompt_tokens(GROUNDED[0])
    tokens, _ = generate(rt, GROUNDED[0], "none", None, n=24)
    assert_lossless(rt.model, prompt, tokens, margin(rt.model))
    assert_lossless(rt.model, prompt, tokens[:12], margin(rt.model))  # a prefix of a text that passed
    # position 17 swapped for a token far from the best: the check names it, though the text before it passed, its
    # prompt's cache is kept and a longer text of the same start passed before
    with Context(rt.model, n_ctx=512) as ctx:
        ctx.decode(prompt[:-1])
        row = ctx.decode([prompt[-1], *tokens[:17]], all_logits=True)[-1]
        wrong = int(np.argsort(row)[-50])
    bad = [*tokens[:17], wrong, *tokens[18:]]
    with pytest.raises(AssertionError, match=r"not lossless at position 17 of 24"):
        assert_lossless(rt.model, prompt, bad, margin(rt.model))
    with pytest.raises(AssertionError, match=r"not lossless at position 17 of 18"):
        assert_lossless(rt.model, prompt, bad[:18], margin(rt.model))


def test_every_emitted_token_is_the_argmax_of_its_own_verifying_pass(model_path: Path) -> None:
    with Model(model_path) as model, RecordingContext(model, n_ctx=1024) as ctx:
        from localspec.drafters.ngram import NgramDrafter
        from localspec.speculative.loop import Generator
        from localspec.speculative.policy import DraftPolicy

        gen = Generator(ctx, model.vocab, [NgramDrafter()], GREEDY, DraftPolicy(fixed=6))
        for prompt in GROUNDED:
            ctx.verified.clear()
            tokens = model.vocab.tokenize(prompt)
            steps = [e for e in gen.generate(tokens, GenerationSettings(max_tokens=40)) if isinstance(e, Step)]
            assert len(steps) == len(ctx.verified)
            drafted = 0
            for step, best in zip(steps, ctx.verified):
                emitted = [t.id for t in step.emitted]
                assert emitted == [int(x) for x in best[: len(emitted)]]
                drafted += len(step.accepted) + len(step.rejected)
            assert drafted > 0


def test_draft_model_equal_to_target_is_nearly_always_accepted_and_lossless(model_path: Path) -> None:
    spec = SpeculationSettings(drafter="draft", draft_model=str(model_path), k=4)
    with Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=1024), spec, GREEDY)) as rt:
        drafted = accepted = 0
        for prompt in ["Once upon a time", GROUNDED[1]]:
            history = rt.prompt_tokens(prompt)
            start = len(history)
            for e in rt.generator.generate(list(history), GenerationSettings(max_tokens=40)):
                if not isinstance(e, Step):
                    continue
                drafted += len(e.accepted) + len(e.rejected)
                accepted += len(e.accepted)
                history += [t.id for t in e.emitted]
            assert_lossless(rt.model, history[:start], history[start:], margin(rt.model), label="draft = target")
    assert drafted > 30
    assert accepted / drafted >= 0.85


def test_kv_rollback_leaves_exactly_the_accepted_tokens(model_path: Path) -> None:
    rng = np.random.default_rng(3)
    with Model(model_path) as model, Context(model, n_ctx=1024) as ctx, Context(model, n_ctx=1024) as fresh:
        history = model.vocab.tokenize("The history of the lighthouse begins in")
        ctx.decode(history)
        for _ in range(25):
            draft = [int(t) for t in rng.integers(100, 20000, size=int(rng.integers(1, 9)))]
            ctx.decode(draft, all_logits=True)
            keep = int(rng.integers(0, len(draft) + 1))
            ctx.truncate(len(history) + keep)
            history += draft[:keep]
            assert ctx.tokens == history
        probe = [236761]
        rolled = ctx.decode(probe)[-1].copy()
        fresh.decode(history)
        clean = fresh.decode(probe)[-1]
        top = np.argsort(clean)[-20:]
        assert int(rolled.argmax()) == int(clean.argmax())
        assert float(np.abs(rolled[top] - clean[top]).max()) < 1.5  # batching noise, not a stale cache


def test_a_draft_with_another_tokenizer_is_refused(tmp_path: Path, model_path: Path) -> None:
    other = tmp_path / "other-bos.gguf"
    copy_model(model_path, other, int_overrides={"tokenizer.ggml.bos_token_id": 5})
    with Model(model_path) as target, Model(other) as draft, pytest.raises(UserError, match="BOS 2 vs 5"):
        check_compatible(target, draft)


# "B:" was followed by " yes" last: n-gram drafts propose " yes", which the target gives 0.57 (and " no" 0.37)
VOTES = "A: yes\nB: no\nA: yes\nB: yes\nA: no\nB:"
# no truncation: batching noise must not move a token in or out of the support
UNSHAPED = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
DRAWS = 200


@pytest.fixture(scope="module")
def votes(runtime: Runtime) -> Distribution:
    """The target's own distribution of the next token after VOTES, from one pass."""
    prompt = runtime.prompt_tokens(VOTES)
    with Context(runtime.model, n_ctx=512) as ctx:
        ctx.decode(prompt[:-1])
        return shape(ctx.decode(prompt[-1:], all_logits=True)[0], UNSHAPED)


def test_sampled_speculation_emits_the_targets_distribution(runtime: Runtime, votes: Distribution) -> None:
    """Temperature 1, n-gram drafts of 3 (" yes" is drafted every time): the first token of DRAWS (200) seeded answers,
    drafted, accepted or rejected by rejection sampling, against the target's distribution."""
    rt, prompt = runtime, runtime.prompt_tokens(VOTES)
    counts: dict[int, int] = {}
    drafted = rejected = 0
    rt.set_drafter("ngram")
    try:
        for seed in range(DRAWS):
            rt.generator.sampling = replace(UNSHAPED, seed=seed)
            rt.generator.policy.reset()
            rt.generator.policy.fixed = 3
            first = next(e for e in rt.generator.generate(prompt, GenerationSettings(max_tokens=2))
                         if isinstance(e, Step))
            counts[first.emitted[0].id] = counts.get(first.emitted[0].id, 0) + 1
            drafted += bool(first.accepted or first.rejected)
            rejected += bool(first.rejected) and not first.accepted
    finally:
        rt.generator.sampling = GREEDY
    # the first token was a draft to verify nearly every time, and the target turned it down some of the time
    assert drafted >= DRAWS * 0.9 and rejected > 0, (drafted, rejected)
    observed = np.array([counts.get(int(t), 0) for t in votes.ids])
    assert observed.sum() == DRAWS  # nothing outside the target's support
    stat, df = chi_square(observed, votes.probs)
    assert stat < chi_square_critical(df), (stat, df, dict(zip(votes.ids.tolist(), observed.tolist())))


def test_the_draws_used_reject_a_wrong_distribution(votes: Distribution) -> None:
    """The test above has the power to fail: 200 draws of what a broken loop would emit (the draft " yes" always
    taken, or taken half again as often) are told from the target's distribution, 19 times in 20 at least."""
    assert votes.probs.max() < 0.6  # the draft is not the target's only likely token: a wrong loop can show
    for name, wrong in wrongs(votes.probs).items():
        assert told_apart(votes.probs, wrong, DRAWS) >= 19, name
