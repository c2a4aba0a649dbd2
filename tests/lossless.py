"""The lossless check for greedy texts, one for every test that compares them.

A greedy run emits, at each position, the argmax of the logits its own verifying pass computed. Passes of other sizes
run other kernels, so a re-score may rank two close candidates otherwise (NOTES.md, "Numerics"). The check therefore
re-scores the prompt and the whole text in one prefill, all logits kept, and asserts at every position that the
emitted token's logit is within the device's measured margin of the best one (the best the grammar allows, under a
constraint). Garbage at a low-confidence position, or a rollback bug that shows only after a first near-tie, fails
it; two texts that part at a near-tie both pass, each on its own.

The margin is the product's own (``Runtime.noise``, speculative/noise.py): how far this device's logits move
between the check's prefill and passes of 1, 4, 8 and 16 rows, measured once per model and device and cached.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine import Context, Device, Model
from localspec.machine import usable_cores
from localspec.models.files import known_sha256
from localspec.speculative.noise import PROMPTS, load_or_measure_noise

if TYPE_CHECKING:
    from localspec.structured.constraint import Constraint

CHUNK = 128  # rows scored a pass: 128 × a 262k vocabulary is 128 MiB of logits, read in place
_margins: dict[str, float] = {}
# texts already found lossless, by (model, prompt, margin): drafters that agree emit the same text, and its check is
# ~10 ms a token on a 2-core CPU (a 262k-vocabulary row a position); a prefix of a checked text needs no check either
_passed: dict[tuple[str, tuple[int, ...], float], list[tuple[int, ...]]] = {}


def margin(model: Model) -> float:
    """This device's near-tie margin on the check's prefill, as ``Runtime.noise`` has it: measured once per model
    and device (seconds), then cached in localspec's home."""
    key = str(model.path)
    if key not in _margins:
        threads = usable_cores()
        with Context(model, n_ctx=1024, n_threads=threads) as ctx:
            prompts = [model.vocab.tokenize(p, add_special=True, parse_special=True) for p in PROMPTS]
            noise = load_or_measure_noise(ctx, known_sha256(model.path), Device.of(model, threads), prompts,
                                          say=lambda _: None)
        _margins[key] = noise.margin
    return _margins[key]


class _Checker:
    """The check's own model and context for one GGUF: loaded once per test process, and apart from whatever model
    object the run used (a test's fixture may close its own). The prompt's cache is kept from one check to the
    next: a test checks several texts after one prompt, and a prefill costs as much as the rows it scores."""

    def __init__(self, path: Path) -> None:
        self.model = Model(path)
        self.ctx: Context | None = None

    def context(self, n_ctx: int) -> Context:
        # a context a thread: llama.cpp keeps a thread team per calling thread (engine/context.py), and a chat's
        # check runs on its engine thread
        if self.ctx is None or self.ctx.n_ctx < n_ctx or self.ctx._thread not in (None, threading.get_ident()):
            if self.ctx is not None:
                self.ctx.close()
            self.ctx = Context(self.model, n_ctx=max(2048, n_ctx), n_batch=CHUNK, n_threads=usable_cores())
        return self.ctx

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.close()
        self.model.close()


_checkers: dict[str, _Checker] = {}


def _checker(path: Path) -> _Checker:
    return _checkers.get(str(path)) or _checkers.setdefault(str(path), _Checker(path))


def checking_model(path: Path) -> Model:
    """The check's own model of ``path``, loaded once per test process: for a test that needs a model only to check
    texts (a load costs a second, most of it the 262k-token vocabulary)."""
    return _checker(path).model


@atexit.register
def _close_checkers() -> None:  # each context before its model: llama.cpp frees nothing of a model twice
    for checker in _checkers.values():
        checker.close()


def assert_lossless(model: Model, prompt: Sequence[int], emitted: Sequence[int], margin: float, *,
                    constraint: Constraint | None = None, label: str = "") -> None:
    """Every token of ``emitted`` (the run's text after ``prompt``) is within ``margin`` of the best logit at its
    position; ``constraint``: of the best the grammar allows (a fresh one, fed the text as it goes). Fails at the
    first position that is not, naming both tokens and their logits."""
    prompt, emitted = list(prompt), list(emitted)
    assert prompt, "the check needs the prompt the text followed"
    key = (str(model.path), tuple(prompt), margin)
    if constraint is None and any(done[:len(emitted)] == tuple(emitted) for done in _passed.get(key, [])):
        return
    vocab = model.vocab
    # rows a pass: as many as the text needs, up to CHUNK (the passes' sizes, not the cache, set the numerics)
    step = min(CHUNK, -(-len(emitted) // 16) * 16 or 16)
    checker = _checker(model.path)
    ctx = checker.context(len(prompt) + len(emitted))
    # the prompt's cache kept where the last check's prompt agrees with this one; the rest decoded
    kept = next((i for i, (a, b) in enumerate(zip(ctx.tokens, prompt[:-1])) if a != b),
                min(len(ctx.tokens), len(prompt) - 1))
    ctx.truncate(kept)
    for start in range(kept, len(prompt) - 1, step):
        ctx.decode(prompt[start:min(start + step, len(prompt) - 1)])
    # row i predicts emitted[i]: it is scored after the prompt's last token and the text's first i tokens
    feed = [prompt[-1], *emitted[:-1]]
    for start in range(0, len(emitted), step):
        for i, row in enumerate(ctx.decode(feed[start:start + step], all_logits=True), start):
            token = emitted[i]
            allowed = None if constraint is None else _allowed(constraint.matcher, len(row))
            best = int(row.argmax()) if allowed is None else int(allowed[np.argmax(row[allowed])])
            gap = float(row[best] - row[token])
            if gap > margin:
                raise AssertionError(
                    f"{label + ': ' if label else ''}not lossless at position {i} of {len(emitted)}: emitted "
                    f"{token} {vocab.token_text(token)!r} (logit {row[token]:.3f}), the best {best} "
                    f"{vocab.token_text(best)!r} ({row[best]:.3f}): a gap of {gap:.3f} > the margin "
                    f"{margin:.3f}; the text to there: {_text(vocab, emitted[:i])!r}")
            if constraint is not None:
                assert constraint.matcher.consume_tokens([token]), f"{label}: the grammar refuses {token} at {i}"
    ctx.truncate(len(prompt) - 1)  # the next check after this prompt starts from its cache
    if constraint is None:
        _passed.setdefault(key, []).append(tuple(emitted))


def _allowed(matcher: object, n_vocab: int) -> np.ndarray:
    """The ids llguidance's own matcher allows next (its mask, read as it gives it, the ends included where the
    grammar may end): the reference, independent of the product's masking (structured/constraint.py)."""
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)  # type: ignore[attr-defined]
    return np.flatnonzero(np.unpackbits(mask, bitorder="little")[:n_vocab])


def assert_lossless_text(model: Model, prompt: str, text: str, margin: float, *, chat: bool = False,
                         label: str = "") -> None:
    """``text`` as a server answered ``prompt`` (``chat``: a chat template's whole rendered prompt, special tokens
    parsed), checked as its tokens: the text tokenized after the prompt, from where the two tokenize alike."""
    vocab = model.vocab
    head = vocab.tokenize(prompt, add_special=True, parse_special=chat)
    whole = vocab.tokenize(prompt + text, add_special=True, parse_special=chat)
    common = next((i for i, (a, b) in enumerate(zip(head, whole)) if a != b), min(len(head), len(whole)))
    assert_lossless(model, whole[:common], whole[common:], margin, label=label)


def _text(vocab: object, tokens: Sequence[int]) -> str:
    text = b"".join(vocab.piece(t) for t in tokens).decode(errors="replace")  # type: ignore[attr-defined]
    return text if len(text) <= 160 else "…" + text[-160:]
