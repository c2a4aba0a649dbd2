"""The batch scheduler, exactly: on the batch-invariant toy model every sequence's text is what it is alone, whatever
shares its passes, for greedy and seeded sampling, mixed drafters and lengths, and sequences joining mid-batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.events import Event, Finished, Prefill, Step
from localspec.settings import GenerationSettings, SamplingSettings
from localspec.speculative.costs import PassCosts
from localspec.speculative.jobs import Failed, Job, PassStats
from localspec.speculative.loop import Generator, Target
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.scheduler import Scheduler
from tests.toy import ToyContext, ToyLanes, ToyModel

TARGET = ToyModel(seed=1)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 4], [10, 11, 10, 11, 10, 11, 12], [42], [7, 7, 7, 7, 7, 7, 7, 7, 7],
           [3, 9, 27, 3, 9, 27, 3, 9], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], [13, 14]]
DRAFTERS = ["none", "ngram", "draft", "auto"]
# a calibration-like curve (a pass of n rows costs more than one, less than n), so the policy drafts from the start
CURVE = {n: 1e-3 * (1 + 0.3 * (n - 1)) for n in range(1, 65)}


def drafters_of(kind: str, sampling: SamplingSettings) -> list:
    def model() -> ModelDrafter:
        return ModelDrafter(ToyContext(ToyModel(seed=2, noise_from=TARGET, noise=0.7)), sampling,  # type: ignore[arg-type]
                            np.random.default_rng(7), owns_model=False)

    return {"none": [], "ngram": [NgramDrafter()], "draft": [model()], "auto": [NgramDrafter(), model()]}[kind]


def alone(prompt: list[int], kind: str, settings: GenerationSettings, sampling: SamplingSettings,
          k: int | None = None) -> list[int]:
    gen = Generator(ToyContext(TARGET), TARGET, drafters_of(kind, sampling), sampling,  # type: ignore[arg-type]
                    DraftPolicy(k_max=8, fixed=k))
    return [t.id for e in gen.generate(prompt, settings) if isinstance(e, Step) for t in e.emitted]


def batch(jobs: list[Job], parallel: int, kinds: list[str], k: int | None = None,
          **kw: object) -> tuple[dict[int, list[int]], ToyLanes, list[tuple[Job, Event]]]:
    lanes = ToyLanes(TARGET, parallel, **kw)  # type: ignore[arg-type]
    costs = PassCosts(dict(CURVE))
    kind_of = {id(job): kind for job, kind in zip(jobs, itertools.cycle(kinds))}
    made: list[Job] = []

    def make(target: Target, job: Job) -> Generator:
        sampling = job.sampling
        kind = kind_of[id(jobs[len(made)])]
        made.append(jobs[len(made)])
        return Generator(target, TARGET, drafters_of(kind, sampling), sampling,  # type: ignore[arg-type]
                         DraftPolicy(k_max=8, fixed=k, costs=costs))

    events = list(Scheduler(lanes, make, costs).run(jobs))
    out: dict[int, list[int]] = {i: [] for i in range(len(jobs))}
    index = {id(job): i for i, job in enumerate(jobs)}
    for job, e in events:
        if isinstance(e, Step):
            out[index[id(job)]].extend(t.id for t in e.emitted)
    return out, lanes, events


@pytest.mark.parametrize("parallel", [1, 2, 4, 8])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_sequence_gets_its_text_alone_whatever_shares_its_passes(parallel: int, temperature: float) -> None:
    # mixed drafters and lengths; with fewer lanes than prompts, sequences end and others join mid-batch
    lengths = [40, 7, 60, 1, 25, 50, 13, 33]
    jobs = [Job(p, GenerationSettings(max_tokens=n), SamplingSettings(temperature=temperature, seed=i))
            for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))]
    # a model's sampled drafts change which tokens rejection sampling keeps (the distribution stays the target's):
    # their text is the same alone only with the same draft lengths, so sampling pins k
    k = None if temperature == 0 else 3
    got, lanes, events = batch(jobs, parallel, DRAFTERS, k)
    for i, job in enumerate(jobs):
        kind = DRAFTERS[i % len(DRAFTERS)]
        assert got[i] == alone(job.prompt, kind, job.settings, job.sampling, k), f"prompt {i} ({kind})"
    # each job: one Prefill, then its steps, then one Finished whose stats count its tokens
    for i, job in enumerate(jobs):
        mine = [e for j, e in events if j is job]
        assert isinstance(mine[0], Prefill) and isinstance(mine[-1], Finished)
        assert mine[-1].stats.generated_tokens == len(got[i])
    if parallel > 1:  # passes really were shared
        assert lanes.passes < sum(len(t) for t in got.values())
        assert max(lanes.rows) > 1 + 3  # more than one sequence's draft in a pass


def test_the_same_job_alone_and_in_a_crowd_samples_the_same_text() -> None:
    sampling = SamplingSettings(temperature=1.0, seed=11)
    job = Job(PROMPTS[0], GenerationSettings(max_tokens=50), sampling)
    crowd = [job] + [Job(p, GenerationSettings(max_tokens=30), SamplingSettings(temperature=1.0, seed=3))
                     for p in PROMPTS[1:6]]
    one, _, _ = batch([job], 1, ["ngram"])
    many, _, _ = batch(crowd, 4, ["ngram"])
    assert one[0] == many[0]


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode() -> None:
    long_prompt = [(i * 7) % 40 + 1 for i in range(300)]
    # the long prompt takes the second lane when its short job ends, while the first job decodes
    jobs = [Job(PROMPTS[0], GenerationSettings(max_tokens=60)), Job(PROMPTS[1], GenerationSettings(max_tokens=2)),
            Job(long_prompt, GenerationSettings(max_tokens=5))]
    lanes = ToyLanes(TARGET, 2)
    costs = PassCosts(dict(CURVE))

    def make(target: Target, job: Job) -> Generator:
        sampling = job.sampling
        return Generator(target, TARGET, [], sampling, DraftPolicy(k_max=8, costs=costs))  # type: ignore[arg-type]

    sizes: list[int] = []
    chunks: list[bool] = []  # whether each pass carried a prompt chunk
    original = lanes.decode

    def spy(parts):  # noqa: ANN001, ANN202 — records what each pass held, then decodes for real
        sizes.append(sum(len(p.tokens) for p in parts))
        chunks.append(any(p.want is None for p in parts))
        return original(parts)

    lanes.decode = spy  # type: ignore[method-assign]
    stats = PassStats()
    events = list(Scheduler(lanes, make, costs, prefill_chunk=32, stats=stats).run(jobs))
    assert max(sizes[1:]) <= 32 + 1  # after the first pass: the running sequence's row and a chunk of the prompt
    assert sum(size > 30 for size in sizes) >= 300 // 32
    # the passes that carried a prompt chunk are counted apart, with their share of the passes' time
    assert stats.passes == len(chunks) and stats.prompt_passes == sum(chunks) >= 300 // 32
    assert 0 < stats.prompt_seconds < stats.seconds
    got = [t.id for j, e in events if j is jobs[2] and isinstance(e, Step) for t in e.emitted]
    assert got == alone(long_prompt, "none", GenerationSettings(max_tokens=5), SamplingSettings())


def test_a_shared_prefix_is_computed_once_and_copied() -> None:
    system = [(i * 5) % 40 + 1 for i in range(100)]
    jobs = [Job(system + [q, q + 1], GenerationSettings(max_tokens=10)) for q in (2, 4, 6, 8)]
    got, lanes, _ = batch(jobs, 4, ["ngram"])
    assert lanes.shared >= 3 * len(system)
    for i, job in enumerate(jobs):
        assert got[i] == alone(job.prompt, "ngram", job.settings, job.sampling)


def test_a_prompt_the_context_cannot_hold_fails_alone() -> None:
    jobs = [Job(PROMPTS[0], GenerationSettings(max_tokens=10)), Job(list(range(1, 40)) * 3),
            Job(PROMPTS[1], GenerationSettings(max_tokens=10))]
    got, _, events = batch(jobs, 2, ["ngram"], n_ctx=100)
    failed = [(j, e) for j, e in events if isinstance(e, Failed)]
    assert [j for j, _ in failed] == [jobs[1]] and "raise --ctx" in failed[0][1].message
    assert got[0] == alone(PROMPTS[0], "ngram", jobs[0].settings, jobs[0].sampling)
    assert got[2] == alone(PROMPTS[1], "ngram", jobs[2].settings, jobs[2].sampling)


def test_cancelling_finishes_every_running_job_as_interrupted_and_starts_no_more() -> None:
    jobs = [Job(p, GenerationSettings(max_tokens=50)) for p in PROMPTS]
    lanes = ToyLanes(TARGET, 2)
    costs = PassCosts(dict(CURVE))

    def make(target: Target, job: Job) -> Generator:
        sampling = job.sampling
        return Generator(target, TARGET, [NgramDrafter()], sampling, DraftPolicy(k_max=8, costs=costs))  # type: ignore[arg-type]

    def cancelled() -> bool:
        return lanes.passes >= 5

    finished = [(j, e) for j, e in Scheduler(lanes, make, costs).run(jobs, cancelled) if isinstance(e, Finished)]
    assert [e.reason for _, e in finished] == ["interrupted", "interrupted"]
    assert [j for j, _ in finished] == jobs[:2]


def test_the_policy_drafts_less_when_more_sequences_share_a_pass() -> None:
    # a device where a pass of up to 8 rows costs about one of 1, and every row past 8 costs a lot (an H100's shape)
    curve = {n: 1e-3 * (1 + 0.05 * (n - 1)) if n <= 8 else 3e-3 + 1e-4 * n for n in range(1, 129)}
    repetitive = [[i % 5 + 1 for i in range(40)] for _ in range(8)]
    drafted = {}
    for parallel in (1, 8):
        lanes = ToyLanes(TARGET, parallel, max_rows=128)
        costs = PassCosts(dict(curve))

        def make(target: Target, job: Job, costs: PassCosts = costs) -> Generator:
            sampling = job.sampling
            return Generator(target, TARGET, [NgramDrafter()], sampling,  # type: ignore[arg-type]
                             DraftPolicy(k_max=8, costs=costs))

        jobs = [Job(p, GenerationSettings(max_tokens=30)) for p in repetitive]
        events = list(Scheduler(lanes, make, costs).run(jobs))
        steps = [e for _, e in events if isinstance(e, Step)]
        drafted[parallel] = sum(e.k for e in steps) / len(steps)
    assert drafted[8] < drafted[1] / 2


def _plain(costs: PassCosts):  # noqa: ANN202 — a make_generator without drafts
    def make(target: Target, job: Job) -> Generator:
        return Generator(target, TARGET, [], job.sampling, DraftPolicy(k_max=8, costs=costs))  # type: ignore[arg-type]

    return make


def test_a_queue_that_has_no_job_yet_keeps_the_scheduler_waiting_not_ending() -> None:
    # a server's queue: None means "nothing yet"; with nothing running the scheduler calls idle() to wait
    first, second = (Job(p, GenerationSettings(max_tokens=6)) for p in PROMPTS[:2])
    done: list[Job] = []
    idles: list[int] = []
    lanes = ToyLanes(TARGET, 2)
    costs = PassCosts(dict(CURVE))

    def queue():  # noqa: ANN202
        yield first
        while not done:
            yield None
        yield None  # nothing for a while after the first job ended: the scheduler waits in idle()
        yield None
        yield second

    events = []
    for job, event in Scheduler(lanes, _plain(costs), costs).run(queue(), idle=lambda: idles.append(lanes.passes)):
        events.append((job, event))
        if isinstance(event, Finished):
            done.append(job)
    assert done == [first, second]
    assert len(idles) == 2
    got = [t.id for j, e in events if j is second and isinstance(e, Step) for t in e.emitted]
    assert got == alone(PROMPTS[1], "none", GenerationSettings(max_tokens=6), SamplingSettings())


def test_a_job_nobody_wants_any_more_stops_before_the_next_pass_and_frees_its_lane() -> None:
    gone = {"flag": False}
    lanes = ToyLanes(TARGET, 1)
    costs = PassCosts(dict(CURVE))
    first = Job(PROMPTS[0], GenerationSettings(max_tokens=200), stop=lambda: gone["flag"])
    second = Job(PROMPTS[1], GenerationSettings(max_tokens=5))
    seen = []
    for job, event in Scheduler(lanes, _plain(costs), costs).run([first, second]):
        seen.append((job, event))
        if job is first and isinstance(event, Step) and sum(isinstance(e, Step) for j, e in seen if j is first) == 3:
            gone["flag"] = True
    ends = [(j, e.reason) for j, e in seen if isinstance(e, Finished)]
    assert ends == [(first, "interrupted"), (second, "length")]
    assert sum(isinstance(e, Step) for j, e in seen if j is first) == 3


def test_a_conversation_that_comes_back_takes_the_lane_that_kept_it_and_reuses_its_cache() -> None:
    lanes = ToyLanes(TARGET, 2)
    costs = PassCosts(dict(CURVE))
    turn1 = [(i * 3) % 40 + 1 for i in range(60)]
    other = [(i * 11) % 40 + 1 for i in range(60)]
    first = [Job(turn1, GenerationSettings(max_tokens=5)), Job(other, GenerationSettings(max_tokens=30))]
    events = list(Scheduler(lanes, _plain(costs), costs).run(first))
    answer = [t.id for j, e in events if j is first[0] and isinstance(e, Step) for t in e.emitted]
    # the next turn resends the conversation with the answer and a new message
    turn2 = turn1 + answer + [7, 8, 9]
    second = Job(turn2, GenerationSettings(max_tokens=5))
    events = list(Scheduler(lanes, _plain(costs), costs).run([second]))
    prefill = next(e for _, e in events if isinstance(e, Prefill))
    assert prefill.prompt_tokens == len(turn2)
    assert prefill.new_tokens <= 4  # only the new message (and the answer's last token) was computed
    got = [t.id for _, e in events if isinstance(e, Step) for t in e.emitted]
    assert got == alone(turn2, "none", GenerationSettings(max_tokens=5), SamplingSettings())


def test_a_new_scheduler_over_the_same_lanes_never_reuses_another_scopes_prefix() -> None:
    # a server builds a new scheduler over its lanes after a failed pass: the scope of what a lane caches must
    # come along with the lane, or one key's cached prompt is reused (and timed) by another key
    lanes = ToyLanes(TARGET, 1)
    costs = PassCosts(dict(CURVE))

    def make(target: Target, job: Job) -> Generator:
        return Generator(target, TARGET, [], job.sampling, DraftPolicy(k_max=8, costs=costs))  # type: ignore[arg-type]

    def prefill(scope: str) -> Prefill:
        job = Job(list(PROMPTS[6]), GenerationSettings(max_tokens=4), scope=scope)
        return next(e for _, e in Scheduler(lanes, make, costs).run([job]) if isinstance(e, Prefill))

    assert prefill("key:a").new_tokens == len(PROMPTS[6])
    assert prefill("key:a").new_tokens == 1  # the same key, a new scheduler: its cached prompt is reused
    assert prefill("key:b").new_tokens == len(PROMPTS[6])  # another key computes its own
    assert lanes[0].scope == "key:b"
