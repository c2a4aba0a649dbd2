"""Drafts from earlier requests on the real model: lossless (greedy text = target-only up to near-ties) one at a
time as run and chat generate and in a batch, private per scope, and kept on disk by `localspec run` in a home of
the test's own (never the checkout's)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.batch.run import run_requests
from localspec.cli import app
from localspec.engine.chat import Message
from localspec.events import Finished
from localspec.request import Request
from localspec.runtime import BatchRuntime, Runtime
from localspec.settings import GenerationSettings, HistorySettings, RuntimeSettings, Settings, SpeculationSettings
from localspec.speculative.jobs import Job
from localspec.speculative.scheduler import Scheduler
from tests.generation import generated
from tests.lossless import assert_lossless, margin

N = 32
PEOPLE = [("Alice Smith", "Paris", "alice@example.com"), ("Bob Jones", "Berlin", "bob@example.org"),
          ("Chen Wei", "Madrid", "chen@example.net"), ("Dana Brown", "Oslo", "dana@example.com")]


def messages(i: int) -> list[Message]:
    name, city, email = PEOPLE[i]
    return [Message("user", f"Reply with only a JSON object with the keys name, city and email for this person: "
                            f"{name} lives in {city}; write to {email}.")]


@pytest.fixture(scope="module")
def plain(model_path: Path):  # type: ignore[no-untyped-def]
    rt = Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=512), SpeculationSettings(drafter="none"),
                               history=HistorySettings("off")))
    yield rt
    rt.close()


def _tokens(rt: Runtime, prompt: list[int]) -> tuple[list[int], Finished]:
    return generated(rt, prompt, N)


def test_one_at_a_time_later_requests_draft_from_earlier_ones_losslessly(
    model_path: Path, plain: Runtime
) -> None:
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=512), SpeculationSettings(drafter="auto"),
                        history=HistorySettings("memory"))
    with Runtime.open(settings) as rt:
        assert rt.history is not None and rt.history.path is None
        from_cache = []
        for i in range(len(PEOPLE)):
            prompt = rt.chat_tokens(messages(i))  # what chat and run --chat generate from
            got, finished = _tokens(rt, prompt)
            assert_lossless(plain.model, prompt, got, margin(plain.model), label=f"request {i}")
            from_cache.append(finished.stats.cache_drafted)
            assert finished.stats.cache_accepted <= finished.stats.cache_drafted <= finished.stats.drafted
        assert from_cache[0] == 0 and sum(from_cache[1:]) > 0
        assert rt.history.n_requests == len(PEOPLE)


@pytest.fixture(scope="module")
def batch(model_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=512), SpeculationSettings(drafter="ngram"),
                        generation=GenerationSettings(max_tokens=N), history=HistorySettings("memory"))
    rt = BatchRuntime.open(settings, 2)
    yield rt
    rt.close()


def test_a_batch_learns_from_its_own_earlier_lines_losslessly(
    batch: BatchRuntime, plain: Runtime
) -> None:
    requests = [Request(str(i), messages=tuple(messages(i))) for i in range(len(PEOPLE))]
    results = {int(r.id): r for r in run_requests(batch, requests)}
    assert all(r.ok for r in results.values())
    for i, result in results.items():
        assert_lossless(plain.model, plain.chat_tokens(messages(i)), result.tokens, margin(plain.model),
                        label=f"batch request {i}")
    assert sum(r.stats.cache_drafted for r in results.values()) > 0
    assert batch.trust.get("local")  # what the cache's drafts are worth was learned across the job
    # and only theirs: what a sequence learned of its own text's matches is its own
    assert all(kind.startswith("cache/") for kind in batch.trust["local"])


def test_scopes_are_private_in_drafts_and_in_reused_prefixes(batch: BatchRuntime) -> None:
    prompt = batch.prompt_tokens("Count: one two three four five six seven eight nine ten. Again: one two")
    text = prompt + batch.prompt_tokens(" three four five six seven eight nine ten eleven twelve")[1:]
    assert batch.history is not None
    batch.history.feed(text * 2, "key:mine")

    def run(scope: str) -> int:
        job = Job(list(prompt), GenerationSettings(max_tokens=24), scope=scope)
        scheduler = Scheduler(batch.lanes, batch.make_generator, batch.costs, parallel=1)
        finished = [e for _, e in scheduler.run([job]) if isinstance(e, Finished)]
        return finished[0].stats.cache_drafted

    assert run("key:theirs") == 0
    assert run("key:mine") > 0


def test_run_keeps_its_history_on_disk_and_no_keep_history_does_not(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calibration = Path(os.environ["LOCALSPEC_HOME"]) / "cache" / "calibration"
    if calibration.is_dir():  # the pass costs measured already: not measured again in the test's own home
        shutil.copytree(calibration, tmp_path / "cache" / "calibration")
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("LOCALSPEC_HISTORY")  # run's own default: on disk
    runner = CliRunner()
    prompt = "Reply with only a JSON object with the keys name and city: Alice Smith lives in Paris."

    def run(*flags: str) -> dict:
        result = runner.invoke(app, ["run", prompt, "--chat", "-m", str(model_path), "-n", "24", "--ctx", "512",
                                     "--json", *flags])
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["stats"]

    assert run()["cache_drafted"] == 0
    files = list((tmp_path / "cache" / "history").glob("*.npz"))
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert run()["cache_drafted"] > 0  # the next run drafts from the last one's answer
    shown = runner.invoke(app, ["cache", "--json"])
    scopes = json.loads(shown.stdout)["histories"][0]["scopes"]
    assert scopes == {"local": {"requests": 2, "tokens": scopes["local"]["tokens"]}}


def test_keep_history_flags_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from localspec.cli.options import build_options

    monkeypatch.delenv("LOCALSPEC_HISTORY")
    assert build_options(keep_history=False).history.resolved("disk") == "memory"
    assert build_options(keep_history=True).history.resolved("memory") == "disk"
    assert build_options().history.resolved("memory") == "memory"  # serve's default
    monkeypatch.setenv("LOCALSPEC_HISTORY", "off")
    assert build_options().history.resolved("disk") == "off"
    assert build_options(keep_history=True).history.resolved("disk") == "disk"  # the flag over the setting
