"""Greedy passes through llama.cpp's backend sampler: the same tokens as numpy's argmax of the same logits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.drafters.ngram import NgramDrafter
from localspec.engine import Context, Model
from localspec.engine.context import backend_sampling_available
from localspec.events import Step
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.loop import Generator
from localspec.speculative.policy import DraftPolicy

K_MAX = 8
GREEDY = SamplingSettings()
PROMPTS = [
    "Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
    "def add(a, b):\n    return a + b\n\n# The same function, renamed to plus:\ndef plus(a, b):",
    "Once upon a time",
]


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[Model]:
    with Model(model_path) as m:
        yield m


@pytest.fixture(scope="module")
def contexts(model: Model) -> Iterator[tuple[Context, Context]]:
    """One context that verifies with the backend sampler, one that takes numpy's argmax of the logits."""
    with Context(model, n_ctx=1024, greedy_rows=K_MAX + 1) as backend, Context(model, n_ctx=1024) as logits:
        assert backend.backend_sampling and not logits.backend_sampling
        yield backend, logits


def test_this_build_has_backend_sampling() -> None:
    # llama-cpp-python 0.3.36 (llama.cpp 0c1e57098) has it: a build that loses it would silently fall back
    assert backend_sampling_available()


def test_backend_argmax_is_the_argmax_of_the_same_pass(model: Model, contexts: tuple[Context, Context]) -> None:
    backend, plain = contexts
    history = model.vocab.tokenize(PROMPTS[0], add_special=True)
    for ctx in contexts:
        ctx.clear()
        ctx.feed(history)
    rng = np.random.default_rng(4)
    compared = 0
    for n in [1, 2, 3, 5, 8, 9, 4, 1]:
        batch = [int(t) for t in rng.integers(300, 30000, size=n)]
        ids = backend.decode_argmax(batch)
        rows = plain.decode(batch, all_logits=True)
        for row, token in zip(rows, ids):
            best = int(row.argmax())
            # an exact float tie may break either way (numpy: first index, ggml: its own order)
            assert token == best or row[token] == row[best]
            compared += 1
    assert compared == 33 and backend.tokens == plain.tokens


def test_logits_and_argmax_passes_interleave_on_one_context(model: Model, contexts: tuple[Context, Context]) -> None:
    """decode() on a context that has the sampler attached returns the true logits (llama.cpp copies none for a
    sequence with a backend sampler, so the context detaches it), and decode_argmax() attaches it again."""
    backend, plain = contexts
    history = model.vocab.tokenize(PROMPTS[1], add_special=True)
    for ctx in contexts:
        ctx.clear()
        ctx.feed(history[:-4])
    for step in range(3):
        chunk = history[-4:] if step == 0 else [236761, 506]
        if step % 2 == 0:
            got = backend.decode(chunk, all_logits=True).copy()
            want = plain.decode(chunk, all_logits=True)
            assert np.array_equal(got, want)  # same batches, same kernels: bit-identical
        else:
            assert backend.decode_argmax(chunk) == plain.decode_argmax(chunk)
    assert backend.decode_argmax([108]) == plain.decode_argmax([108])


def test_a_pass_over_more_positions_than_set_up_for_is_refused(contexts: tuple[Context, Context]) -> None:
    """llama.cpp reserves for greedy_rows outputs and aborts the process on more: refuse before calling it."""
    backend, _ = contexts
    backend.clear()
    too_many = list(range(1000, 1000 + K_MAX + 2))
    with pytest.raises(ValueError, match="at most 9 positions"):
        backend.decode_argmax(too_many)
    with pytest.raises(ValueError, match="at most 9"):
        backend.decode(too_many, all_logits=True)
    assert backend.tokens == []
    backend.decode(too_many)  # one output (the last row): fine
    assert backend.tokens == too_many


def test_a_build_without_backend_sampling_falls_back_to_the_logits(
    model: Model, contexts: tuple[Context, Context], monkeypatch: pytest.MonkeyPatch
) -> None:
    import localspec.engine.context as context_module

    monkeypatch.setattr(context_module, "backend_sampling_available", lambda: False)
    backend, _ = contexts
    history = model.vocab.tokenize(PROMPTS[2], add_special=True)
    with Context(model, n_ctx=256, greedy_rows=K_MAX + 1) as fallback:
        assert not fallback.backend_sampling and fallback.max_rows == K_MAX + 1
        backend.clear()
        for ctx in (backend, fallback):
            ctx.feed(history[:-1])
        assert fallback.decode_argmax(history[-1:] + [506, 3890]) == backend.decode_argmax(history[-1:] + [506, 3890])


def _generate(model: Model, ctx: Context, prompt: str, drafter: NgramDrafter | None,
              sampling: SamplingSettings = GREEDY, n: int = 40) -> list[int]:
    # fixed k: the same drafts, so the same batches and the same numerics on both paths
    drafters = [drafter] if drafter else []
    gen = Generator(ctx, model.vocab, drafters, sampling, DraftPolicy(k_max=K_MAX, fixed=4 if drafter else None))
    steps = [e for e in gen.generate(model.vocab.tokenize(prompt, add_special=True), GenerationSettings(max_tokens=n))
             if isinstance(e, Step)]
    tokens = [t.id for s in steps for t in s.emitted]
    if drafter is not None and prompt == PROMPTS[0]:
        assert len(steps) < len(tokens)  # drafts were accepted: the verifying passes scored several positions
    return tokens


@pytest.mark.parametrize("speculative", [False, True], ids=["target-only", "ngram"])
def test_greedy_generation_is_identical_on_both_paths(model: Model, contexts: tuple[Context, Context],
                                                      speculative: bool) -> None:
    backend, plain = contexts
    for prompt in PROMPTS:
        got = _generate(model, backend, prompt, NgramDrafter() if speculative else None)
        want = _generate(model, plain, prompt, NgramDrafter() if speculative else None)
        assert got == want and len(got) == 40, prompt


def test_sampling_with_temperature_on_a_backend_context_uses_the_logits(
    model: Model, contexts: tuple[Context, Context]
) -> None:
    backend, plain = contexts
    hot = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    got = _generate(model, backend, PROMPTS[2], NgramDrafter(), hot, n=12)
    assert got == _generate(model, plain, PROMPTS[2], NgramDrafter(), hot, n=12)
    # and greedy again afterwards: the sampler is attached once more
    assert _generate(model, backend, PROMPTS[2], None) == _generate(model, plain, PROMPTS[2], None)
