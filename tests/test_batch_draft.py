"""Draft models in a batch (speculative/draft_phase.py), on the real model through the real llama.cpp: every lane's
drafts come from one decode per depth, each lane's greedy text is its text alone up to near-ties, a sampled token
follows the target's distribution, and a lane's draft cache never crosses scopes.

The draft is the embedded model's first 12 of 18 blocks (the early-exit GGUF): a real second model that agrees
often, and is wrong often enough that rejections are exercised."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.batch.run import run_requests
from localspec.events import Step
from localspec.passes import Part
from localspec.request import Request
from localspec.runtime import BatchRuntime, Runtime
from localspec.settings import (
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)
from localspec.speculative.jobs import Job, PassStats
from localspec.speculative.scheduler import Scheduler
from tests.lossless import assert_lossless, checking_model, margin
from tests.test_batch_real import PROMPTS

K = 3
EXIT = 12
LONG = ("Minutes of the garden committee. Present: Ana, Bo, Chen, Dara. The committee agreed to plant beans along "
        "the north fence, to buy two new rain barrels, and to meet again on the first Monday of next month. Ana "
        "will order the seeds; Bo will fetch the barrels. Summary of the decisions, one per line:\n")


def draft_settings(model_path: Path, drafter: str = "early-exit", k: int | None = K) -> Settings:
    return Settings(str(model_path), RuntimeSettings(n_ctx=1024),
                    SpeculationSettings(drafter=drafter, k=k, exit_layer=EXIT, draft_model=str(model_path)),
                    generation=GenerationSettings(max_tokens=32), history=HistorySettings("off"))


@pytest.fixture(scope="module")
def batch(model_path: Path) -> Iterator[BatchRuntime]:
    with BatchRuntime.open(draft_settings(model_path), 4) as rt:
        yield rt


@pytest.fixture(scope="module")
def single(model_path: Path) -> Iterator[Runtime]:
    with Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="none"),
                               history=HistorySettings("off"))) as rt:
        yield rt


def test_every_lane_drafts_in_one_decode_per_depth_and_stays_lossless(batch: BatchRuntime,
                                                                            single: Runtime) -> None:
    phase = batch.drafts
    assert phase is not None and phase.name == "early-exit"
    # 7 on 4 lanes; the last one's prompt is longer than a draft lane catches up in one phase (CATCH_UP)
    prompts = [*PROMPTS, LONG]
    requests = [Request(str(i), prompt=p, max_tokens=32 - 2 * i) for i, p in enumerate(prompts)]
    stats = PassStats()
    results = {r.id: r for r in run_requests(batch, requests, stats=stats)}
    assert all(r.ok for r in results.values())
    drafted = sum(r.stats.drafted for r in results.values())
    accepted = sum(r.stats.accepted for r in results.values())
    assert drafted > 0 and 0 < accepted < drafted  # drafts were verified, and some were rejected
    # the deepest draft is k tokens: its last is the target's to verify, so k decodes, catch-ups folded in
    assert stats.draft_steps > 0 and stats.draft_deepest <= K
    for request in requests:
        got = results[request.id]
        assert_lossless(single.model, single.prompt_tokens(request.prompt or ""), got.tokens, margin(single.model),
                        label=f"request {request.id}")


def test_a_sampled_lane_emits_the_targets_distribution(batch: BatchRuntime, single: Runtime) -> None:
    """The first token of 200 seeded sampled answers drafted by the early-exit model, 4 lanes at a time, against the
    target's own distribution (chi-square): rejection sampling holds per lane."""
    from localspec.sampling import shape
    from tests.stats_helpers import chi_square, chi_square_critical, told_apart, wrongs

    prompt = single.prompt_tokens("My favourite colour is")
    sampling = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    row = single.score(prompt, one_by_one_from=len(prompt))
    p = shape(row, sampling)
    draws = 200
    jobs = [Job(prompt, GenerationSettings(max_tokens=2), SamplingSettings(temperature=1.0, top_k=3, top_p=1.0,
                                                                           min_p=0.0, seed=seed), key=seed)
            for seed in range(draws)]
    scheduler = Scheduler(batch.lanes, batch.make_generator, batch.costs, parallel=batch.parallel,
                          shapes=batch.shapes, drafts=batch.drafts)
    first: dict[object, int] = {}
    drafted = rejected = 0
    for job, event in scheduler.run(jobs):
        if isinstance(event, Step) and job.key not in first:
            first[job.key] = event.emitted[0].id
            drafted += bool(event.accepted or event.rejected)
            rejected += bool(event.rejected) and not event.accepted
    # most first tokens were drafts to verify, and the target turned some down
    assert len(first) == draws and drafted > draws // 2 and rejected > 0, (drafted, rejected)
    for name, wrong in wrongs(p.probs).items():  # and these draws are enough to tell a broken sampler
        assert told_apart(p.probs, wrong, draws) >= 19, name
    observed = np.array([sum(1 for t in first.values() if t == int(i)) for i in p.ids])
    assert observed.sum() == draws  # nothing outside the target's top 3
    stat, df = chi_square(observed, p.probs)
    assert stat < chi_square_critical(df), (stat, df)


def test_auto_looks_up_first_and_drafts_with_the_model_where_lookup_finds_nothing(model_path: Path) -> None:
    with BatchRuntime.open(draft_settings(model_path, "auto"), 2) as rt:
        assert rt.drafts is not None and rt.drafts.name == "draft"
        jobs = [Job(rt.prompt_tokens(p), GenerationSettings(max_tokens=24), key=i) for i, p in enumerate(PROMPTS[:3])]
        scheduler = Scheduler(rt.lanes, rt.make_generator, rt.costs, parallel=rt.parallel, shapes=rt.shapes,
                              drafts=rt.drafts)
        kinds = {e.kind.split("/")[0] for _, e in scheduler.run(jobs) if isinstance(e, Step) and e.kind}
    assert {"ngram", "draft"} <= kinds, kinds


def test_a_draft_lane_keeps_no_cache_across_scopes(batch: BatchRuntime) -> None:
    phase = batch.drafts
    assert phase is not None
    lane = phase.lanes[0]
    prompt = batch.prompt_tokens(PROMPTS[0])
    phase.claim(0, "alice")
    lane.truncate(0)
    phase.lanes.decode([Part(0, prompt, None)])
    assert lane.tokens == prompt
    phase.claim(0, "alice")
    assert lane.tokens == prompt  # the same scope keeps its prefix
    phase.claim(0, "bob")
    assert lane.tokens == [] and lane.scope == "bob"


def test_serve_drafts_every_request_with_the_model_and_a_request_may_leave_it_out(model_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import contextmanager

    from tests.test_serve import PROMPTS as SERVE_PROMPTS
    from tests.test_serve import _lossless, start

    serving = contextmanager(start)("--parallel", "2", "--ctx", "512", "-n", "24", "--drafter", "early-exit",
                                    "--exit-layer", str(EXIT), "--k", str(K), env={"LOCALSPEC_HISTORY": "off"})
    with serving as server:
        client = server.client()

        def ask(prompt: str, extra: dict | None = None):  # type: ignore[no-untyped-def]
            return client.completions.create(model="default", prompt=prompt, max_tokens=24, temperature=0,
                                             extra_body=extra)

        with ThreadPoolExecutor(2) as pool:  # two requests drafted in the same phases
            both = list(pool.map(ask, SERVE_PROMPTS[:2]))
        plain = [ask(p, {"speculation": {"drafter": "none"}}) for p in SERVE_PROMPTS[:2]]
        model = checking_model(model_path)
        for prompt, drafted, alone in zip(SERVE_PROMPTS, both, plain, strict=False):
            timings, off = drafted.model_extra["timings"], alone.model_extra["timings"]  # type: ignore[index]
            assert timings["draft_n"] > 0 and off["draft_n"] == 0
            _lossless(model, prompt, drafted.choices[0].text, alone.choices[0].text)


def _seeded_texts(batch: BatchRuntime, shift: int = 0) -> dict[str, str]:
    requests = [Request(str(i), prompt=p, max_tokens=16, temperature=0.9, seed=10 + i + shift)
                for i, p in enumerate(PROMPTS[:4])]
    return {r.id: r.text for r in run_requests(batch, requests) if r.ok}


def test_a_seeded_batch_gives_its_texts_again(model_path: Path) -> None:
    """Seeded sampled requests on 3 lanes, the same job in two fresh runtimes (as two runs of one command): the same
    texts, with the draft phase (early exit: every lane drafted by one model pass a depth) and without it (lookup);
    another seed, other texts. (One runtime's second job may differ: its policy and draft lanes kept what the first
    taught them, and a sampled text follows the drafts it was verified against.)"""
    for drafter in ("early-exit", "ngram"):
        with BatchRuntime.open(draft_settings(model_path, drafter), 3) as rt:
            assert (rt.drafts is not None) == (drafter == "early-exit")
            first = _seeded_texts(rt)
            other = _seeded_texts(rt, shift=100) if drafter == "ngram" else None  # the seeds are used: once is enough
        with BatchRuntime.open(draft_settings(model_path, drafter), 3) as rt:
            assert _seeded_texts(rt) == first, drafter
        assert len(first) == 4
        assert other is None or sum(other[i] != first[i] for i in first) >= 2, (first, other)
