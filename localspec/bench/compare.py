"""The lossless check, run on every benchmark: each greedy run's tokens against the target-only run's.

A divergence is not automatically a bug. llama.cpp's CPU kernels give slightly different logits for a batch of
tokens than for one token at a time, and speculation verifies in batches, so where the target's top two candidates
are nearly tied the two runs can legitimately pick different tokens (docs/architecture.md, "Numerics"). Each divergence
is therefore classified: the logits of the two candidate tokens at the diverging position are compared (from a
re-decode of the common prefix), and a gap within the measured batch-vs-single noise is a near-tie. A divergence
outside that margin is what a real bug in the speculation loop would look like, and the report says so loudly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from localspec.bench.records import NEAR_TIE_MARGIN, Divergence, RunRecord

BASELINE = "none"  # target-only decoding: the reference every other drafter must reproduce


def first_divergence(baseline: Sequence[int], tokens: Sequence[int]) -> Divergence | None:
    """The first position where two token lists differ (a list that ends early differs where it ends)."""
    n = min(len(baseline), len(tokens))
    for i in range(n):
        if baseline[i] != tokens[i]:
            return Divergence(i, baseline[i], tokens[i])
    if len(baseline) == len(tokens):
        return None
    return Divergence(
        n,
        baseline[n] if n < len(baseline) else None,
        tokens[n] if n < len(tokens) else None,
    )


def first_text_divergence(baseline: str, text: str) -> Divergence | None:
    """Character-level comparison, for runs whose token ids are not available."""
    if baseline == text:
        return None
    n = min(len(baseline), len(text))
    i = next((i for i in range(n) if baseline[i] != text[i]), n)
    return Divergence(i, unit="char")


def logit_gap(row: np.ndarray, a: int, b: int) -> float:
    """|logit a − logit b| in one logits row. For the two top candidates this is the top-2 gap."""
    return abs(float(row[a]) - float(row[b]))


def classify(divergence: Divergence, gap: float | None, margin: float = NEAR_TIE_MARGIN,
             path: str = "prefill") -> Divergence:
    if gap is None:
        return divergence
    return replace(divergence, gap=gap, near_tie=gap <= margin, margin=margin, path=path)


GapFn = Callable[[RunRecord, RunRecord, Divergence], "float | tuple[float, str] | None"]
"""(baseline run, run, divergence) → the measured logit gap (with the path it was measured on: "prefill" or
"decode"), or None; the runner provides one backed by the model."""


def baselines(records: Sequence[RunRecord]) -> dict[str, RunRecord]:
    """Per prompt, the target-only run every other run is compared with: the earliest repeat that finished."""
    out: dict[str, RunRecord] = {}
    for r in sorted((r for r in records if r.drafter == BASELINE), key=lambda r: r.repeat):
        out.setdefault(r.prompt_id, r)
    return out


def annotate(records: Sequence[RunRecord], gap: GapFn | None = None,
             margins: Mapping[str, float] | None = None) -> None:
    """Set ``compared`` and ``divergence`` on every run that has a baseline, classifying token divergences by the
    near-tie margin of the path each gap was measured on (``margins``; NEAR_TIE_MARGIN where none is given).

    Later target-only repeats are compared too: a difference there means decoding itself is not deterministic.
    """
    base = baselines(records)
    for r in records:
        b = base.get(r.prompt_id)
        r.compared = b is not None
        if b is None or b is r:
            r.divergence = None
            continue
        if r.anchor:
            # anchors stream text: compare text; where it differs, locate and classify the difference on the
            # anchor's text re-tokenized (the tokens it most likely generated), falling back to a character index
            div = first_text_divergence(b.text, r.text)
            if div is not None and r.tokens:
                div = first_divergence(b.tokens, r.tokens) or div
        else:
            div = first_divergence(b.tokens, r.tokens)
        if div is not None and div.unit == "token" and gap is not None:
            measured = gap(b, r, div)
            value, path = measured if isinstance(measured, tuple) else (measured, "prefill")
            div = classify(div, value, (margins or {}).get(path, NEAR_TIE_MARGIN), path)
        r.divergence = div
