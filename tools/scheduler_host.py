#!/usr/bin/env python3
"""The batch scheduler's host time a pass: what its Python costs around the shared pass, in the two cases where
copies of a sequence's history showed (8 lanes prefilling long prompts that share a prefix, and 8 lanes in steady
greedy decoding with n-gram drafts). On a GPU a pass of the default model is ~1 ms, so this time is a share of
every pass there; this CPU can measure it. A benchmark, not a test: run it on a quiet machine.

    .venv/bin/python tools/scheduler_host.py
    PYTHONPATH=bench-out/at/COMMIT .venv/bin/python tools/scheduler_host.py   # the same, as at another commit
                                                                              # (tools/at_commit COMMIT makes it)

The model is tests/toy.py's (its logits depend on the last two tokens only, through small tables), so the pass
itself costs little and is timed apart: host = the scheduler's wall time less the time inside the lanes' decode.
It prints µs a pass (the fastest of ``--repeat`` runs) and a digest of every sequence's text, the same before and
after a change that only makes it faster.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: a tree at another commit wins

from localspec.drafters.ngram import NgramDrafter  # noqa: E402
from localspec.events import Step  # noqa: E402
from localspec.settings import GenerationSettings, SamplingSettings  # noqa: E402
from localspec.speculative.costs import PassCosts  # noqa: E402
from localspec.speculative.jobs import Job  # noqa: E402
from localspec.speculative.loop import Generator, Target  # noqa: E402
from localspec.speculative.policy import DraftPolicy  # noqa: E402
from localspec.speculative.scheduler import Scheduler  # noqa: E402
from tests.toy import VOCAB, ToyLanes, ToyModel  # noqa: E402

LANES = 8
CURVE = {n: 1e-3 * (1 + 0.3 * (n - 1)) for n in range(1, 65)}  # a calibration-like curve: drafts pay


def _jobs(case: str) -> list[Job]:
    greedy = SamplingSettings()
    if case == "prefill":  # long prompts, one shared start: the scheduler waits, copies and chunks
        shared = [(7 * i * i + 3 * i) % (VOCAB - 1) + 1 for i in range(3600)]
        return [Job([*shared, *((j * 11 + i) % (VOCAB - 1) + 1 for i in range(400))],
                    GenerationSettings(max_tokens=4), greedy) for j in range(LANES)]
    # steady decoding: short prompts, long answers, every lane drafting from its own text
    return [Job([(j * 5 + i) % (VOCAB - 1) + 1 for i in range(60)], GenerationSettings(max_tokens=400), greedy)
            for j in range(LANES)]


def run(case: str) -> tuple[float, int, str]:
    """(host seconds, passes, digest of the texts) of one run of ``case``."""
    model = ToyModel(seed=1)
    lanes = ToyLanes(model, LANES, n_ctx=8192, n_batch=512)
    inside = 0.0
    decode = lanes.decode

    def timed(parts: list) -> list:
        nonlocal inside
        t = time.perf_counter()
        try:
            return decode(parts)
        finally:
            inside += time.perf_counter() - t

    lanes.decode = timed  # type: ignore[method-assign]
    costs = PassCosts(dict(CURVE))

    def make(target: Target, job: Job) -> Generator:
        return Generator(target, model, [NgramDrafter()], job.sampling,  # type: ignore[arg-type]
                         DraftPolicy(k_max=16, costs=costs))

    jobs = _jobs(case)
    texts: dict[int, list[int]] = {id(j): [] for j in jobs}
    started = time.perf_counter()
    for job, event in Scheduler(lanes, make, costs).run(jobs):
        if isinstance(event, Step):
            texts[id(job)].extend(t.id for t in event.emitted)
    wall = time.perf_counter() - started
    digest = hashlib.sha256(repr([texts[id(j)] for j in jobs]).encode()).hexdigest()[:12]
    return wall - inside, lanes.passes, digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each case; the fastest is printed")
    args = parser.parse_args()
    for case in ("prefill", "steady"):
        runs = [run(case) for _ in range(args.repeat)]
        host, passes, digest = min(runs)
        assert len({r[2] for r in runs}) == 1, "the texts changed between runs"
        print(f"{case:8} {LANES} lanes: {1e6 * host / passes:8.1f} µs host a pass over {passes} passes "
              f"(fastest of {args.repeat}; texts {digest})")


if __name__ == "__main__":
    main()
