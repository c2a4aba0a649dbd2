#!/usr/bin/env python3
"""The n-gram drafter's host time a step, with and without earlier requests' history, over a suite's real greedy
texts: on a GPU a pass of the default model costs ~1 ms, so the microseconds a draft takes are a share of every
step there, and this CPU can measure them. A benchmark, not a test: run it on a quiet machine.

    .venv/bin/python tools/draft_host.py --suite template-emails --suite tool-calls
    PYTHONPATH=bench-out/at/COMMIT .venv/bin/python tools/draft_host.py ...   # the same, as at another commit

The suite's target-only greedy texts are generated once (the embedded model) and cached in
bench-out/draft-host-<suite>-<digest of its file>.json. Then, item after item as one job, the drafter proposes at
every step (up to 16 tokens), the step accepts what the text confirms and the text's next token, and each item's
text joins the history when it ends: what a run drafts, without the model. It prints microseconds a step (propose
+ accept, the fastest of ``--repeat`` runs) and a digest of every proposal, the same before and after a change that
only makes it faster.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CAP = 16


def texts(suite: str) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, greedy output tokens) of each item of ``suite``, generated once and cached."""
    file = HERE / "localspec" / "bench_suites" / f"{suite}.jsonl"
    text = file.read_text(encoding="utf-8")
    # keyed by the suite's content: a changed prompt is generated again (the default model is the embedded one)
    cache = HERE / "bench-out" / f"draft-host-{suite}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    if cache.exists():
        return [(p, o) for p, o in json.loads(cache.read_text())]
    from localspec.events import Finished, Step
    from localspec.runtime import Runtime
    from localspec.settings import GenerationSettings, HistorySettings, RuntimeSettings, Settings, SpeculationSettings

    items = [json.loads(line) for line in text.splitlines() if line.strip()]
    settings = Settings(None, RuntimeSettings(n_ctx=2048), SpeculationSettings(drafter="none"),
                        history=HistorySettings("off"))
    out = []
    with Runtime.open(settings) as rt:
        for item in items:
            prompt = rt.prompt_tokens(item["prompt"])
            tokens: list[int] = []
            for event in rt.generate(prompt, GenerationSettings(max_tokens=item.get("max_tokens", 128))):
                if isinstance(event, Step):
                    tokens += [t.id for t in event.emitted]
                elif isinstance(event, Finished):
                    break
            out.append((prompt, tokens))
    cache.parent.mkdir(exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def run(job: list[tuple[list[int], list[int]]], with_history: bool) -> tuple[float, int, str]:
    """Seconds drafting, steps, and a digest of every proposal, over ``job`` as one job."""
    from localspec.drafters.ngram import NgramDrafter
    from localspec.history.history import History

    history = History("draft-host", None) if with_history else None
    digest = hashlib.sha256()
    seconds, steps = 0.0, 0
    clock = time.perf_counter
    for prompt, output in job:
        drafter = NgramDrafter(history=history.view() if history is not None else None)
        text = list(prompt)
        drafter.begin(text)
        pos = 0
        while pos < len(output):
            t0 = clock()
            draft = drafter.propose(text, CAP)
            t1 = clock()
            truth = output[pos : pos + CAP + 1]
            proposed = draft.tokens
            if draft.fallback is not None:  # the policy may rank the other source first: both are proposals
                proposed = proposed + [-2] + draft.fallback.tokens
            digest.update(repr((proposed, draft.kind)).encode())
            accepted = next((i for i, t in enumerate(draft.tokens) if i >= len(truth) or t != truth[i]),
                            len(draft.tokens))
            accepted = min(accepted, len(truth) - 1)
            text += truth[: accepted + 1]
            pos += accepted + 1
            t2 = clock()
            drafter.accept(text, accepted)
            seconds += (t1 - t0) + (clock() - t2)
            steps += 1
        if history is not None:
            history.feed(text)
    return seconds, steps, digest.hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import localspec

    print(f"localspec from {Path(localspec.__file__).parent}")
    for suite in args.suite or ["template-emails"]:
        job = texts(suite)
        for with_history in (False, True):
            runs = [run(job, with_history) for _ in range(args.repeat)]
            best = min(s for s, _, _ in runs)
            _, steps, digest = runs[0]
            assert len({d for *_, d in runs}) == 1, "the proposals differ between runs of the same code"
            print(f"{suite}, {'with' if with_history else 'without'} the history: {steps} steps, "
                  f"{1e6 * best / steps:.1f} µs a step (propose + accept), proposals {digest}")


if __name__ == "__main__":
    main()
