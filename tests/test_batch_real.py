"""The batch scheduler on the real model through the real llama.cpp: each sequence's greedy text is `run`'s up to
near-ties, lanes never disturb each other's cache, and a request that cannot run fails alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.batch.run import run_requests
from localspec.engine import Model
from localspec.engine.chat import Message
from localspec.engine.lanes import Lanes
from localspec.passes import Part
from localspec.request import Request
from localspec.runtime import BatchRuntime
from localspec.settings import GenerationSettings, RuntimeSettings, SamplingSettings, Settings, SpeculationSettings
from localspec.speculative.jobs import Job
from tests.lossless import assert_lossless, checking_model, margin

PROMPTS = [
    "Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
    "def add(a, b):\n    return a + b\n\n# The same function, renamed to plus:\ndef plus(a, b):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "Write one sentence about the sea.",
    "1, 2, 3, 4, 5,",
    "Q: What is the capital of Italy?\nA:",
]


@pytest.fixture(scope="module")
def batch(model_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="ngram"),
                        generation=GenerationSettings(max_tokens=40))
    rt = BatchRuntime.open(settings, 4)
    yield rt
    rt.close()


def test_greedy_batch_text_is_lossless_at_every_position(batch: BatchRuntime) -> None:
    requests = [Request(str(i), prompt=p, max_tokens=40 - 3 * i) for i, p in enumerate(PROMPTS)]  # 6 on 4 lanes
    results = {r.id: r for r in run_requests(batch, requests)}
    assert sorted(results) == [r.id for r in requests] and all(r.ok for r in results.values())
    drafted = sum(r.stats.drafted for r in results.values())
    assert drafted > 0  # speculation ran inside the batch
    for request in requests:
        got = results[request.id]
        assert got.text == b"".join(batch.model.vocab.piece(t) for t in got.tokens).decode("utf-8", "replace")
        assert_lossless(batch.model, batch.prompt_tokens(request.prompt or ""), got.tokens, margin(batch.model),
                        label=f"request {request.id}")


def test_a_request_that_cannot_run_fails_alone_and_the_rest_finish(batch: BatchRuntime) -> None:
    requests = [
        Request("ok", prompt=PROMPTS[0], max_tokens=8),
        Request("long", prompt="word " * 1500, max_tokens=8),
        Request("hot", prompt=PROMPTS[1], temperature=9.0),
        Request("chat", messages=(Message("user", "Say hi."),), max_tokens=8, temperature=0.7, seed=3),
    ]
    results = {r.id: r for r in run_requests(batch, requests)}
    assert results["ok"].ok and len(results["ok"].tokens) == 8
    assert "raise --ctx" in (results["long"].error or "")
    assert "--temperature" in (results["hot"].error or "")
    assert results["chat"].ok and results["chat"].tokens


def test_a_lane_rolls_back_without_touching_its_neighbours(model_path: Path) -> None:
    with Model(model_path) as model, Lanes(model, 2, n_ctx=256, max_rows=16) as lanes:
        vocab = model.vocab
        a = vocab.tokenize(PROMPTS[2], add_special=True, parse_special=True)
        b = vocab.tokenize(PROMPTS[4], add_special=True, parse_special=True)
        for lane, tokens in ((0, a), (1, b)):
            lanes.begin(lane, Job(tokens, sampling=SamplingSettings()))
            lanes[lane].feed(tokens[:-1])
        first = lanes.decode([Part(0, a[-1:]), Part(1, b[-1:])])
        # lane 0 drafts junk and rolls back; lane 1 decodes on: its next token must be what it is without lane 0
        lanes.decode([Part(0, [first[0][0], 7, 7, 7]), Part(1, [first[1][0]])])
        lanes[0].truncate(len(a))
        lanes[1].truncate(len(b))
        again = lanes.decode([Part(0, [first[0][0]]), Part(1, [first[1][0]])])
        assert lanes[0].tokens == [*a, first[0][0]] and lanes[1].tokens == [*b, first[1][0]]
        lanes[0].truncate(0)
        solo = lanes.decode([Part(1, [again[1][0]])])
        assert solo[0] and lanes[1].tokens[-1] == again[1][0] and len(lanes[0].tokens) == 0


def test_the_python_api_gives_every_prompt_a_result_in_order(model_path: Path) -> None:
    import localspec

    prompts = [PROMPTS[0], {"id": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
               "word " * 700]
    results = list(localspec.generate_many(prompts, model=str(model_path), ctx=512, max_tokens=10, ordered=True,
                                           parallel=2))
    assert [r.id for r in results] == ["0", "chat", "2"]
    assert len(results[0].tokens) == 10 and results[0].text and results[1].ok and len(results[1].tokens) <= 5
    assert not results[2].ok and "raise --ctx" in (results[2].error or "")
    one = localspec.generate(PROMPTS[0], model=str(model_path), ctx=512, max_tokens=10)
    model = checking_model(model_path)
    prompt = model.vocab.tokenize(PROMPTS[0], add_special=True, parse_special=True)
    for tokens in (one.tokens, results[0].tokens):
        assert_lossless(model, prompt, tokens, margin(model))
