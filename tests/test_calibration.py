"""Calibration on the real model: a busy machine is seen and not believed for good; live passes correct the curve
and write it back; the same prompt gets about the same number of passes whatever the timing noise."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.bench.replay import CostTable, load_cost_table, replay
from localspec.bench.suite import load_suite
from localspec.cli import app
from localspec.engine import Context, Device, Model, library_version
from localspec.engine.backend import describe_device
from localspec.engine.context import backend_sampling_available
from localspec.engine.device import device_name
from localspec.events import Step
from localspec.machine import usable_cores
from localspec.models.files import known_sha256, locked
from localspec.runtime import Runtime
from localspec.settings import (
    GenerationSettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)
from localspec.speculative.calibrate import RETRIES, choose_reads, load_or_measure, measure
from localspec.speculative.calibration_cache import Calibration, cache_path, measuring
from localspec.speculative.costs import PassCosts
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.shape_timing import load_or_measure_shapes, measure_shapes
from localspec.speculative.shapes import STEADY, Shapes
from tests.test_pass_costs import busy, noisy

N_MAX = 2  # sizes to time in these tests: enough to see the mechanism, quick on two cores


def _cpu(threads: int) -> Device:
    """This machine's CPU as a runtime that offloads nothing sees it."""
    return Device(threads, 0, False, "", device_name(0), describe_device(0, 0, threads))


CPU = _cpu(2)


@pytest.fixture(scope="module")
def context(model_path: Path) -> Iterator[Context]:
    with Model(model_path) as model, Context(model, n_ctx=512, greedy_rows=N_MAX) as ctx:
        yield ctx


@pytest.fixture(scope="module")
def one_thread(model_path: Path) -> Iterator[Context]:
    """A context on one thread: beside processes that hold the cores, llama.cpp on all of them runs some passes
    about 100x slower (its threads wait on each other), which would make the test minutes long, not the mechanism
    it checks."""
    with Model(model_path) as model, Context(model, n_ctx=512, n_threads=1, greedy_rows=N_MAX) as ctx:
        yield ctx


@contextmanager
def busy_cores() -> Iterator[None]:
    """Two processes that keep both cores busy, as a compile beside a calibration would."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def spinners() -> Iterator[None]:
    with busy_cores():
        yield


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="other processes' CPU time is read from /proc/stat")
def test_a_calibration_beside_a_busy_process_is_provisional_and_measured_again(
    one_thread: Context, spinners: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    context = one_thread
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    said: list[str] = []
    first = load_or_measure(context, "f" * 64, CPU, N_MAX, say=said.append)
    assert "other processes used" in first.provisional
    assert any("once: ~" in line for line in said) and any("provisional" in line for line in said)
    assert first.path is not None and json.loads(first.path.read_text())["provisional"] == first.provisional
    # a disturbed measurement is not kept for good: the next start measures again, and says why
    said.clear()
    second = load_or_measure(context, "f" * 64, CPU, N_MAX, say=said.append)
    assert any("was disturbed" in line for line in said)
    assert second.attempts == 2 and Calibration.read(first.path) == second
    # ... a limited number of times: a machine that is always busy is not measured at every start
    second.attempts = RETRIES
    second.save()
    said.clear()
    assert load_or_measure(context, "f" * 64, CPU, N_MAX, say=said.append) == second and not said


def test_a_calibration_records_how_and_when_and_is_reused(
    context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    quiet = measure(context, N_MAX, rounds=2)
    assert set(quiet.seconds) == set(quiet.measured) == set(range(1, N_MAX + 1))
    assert all("calibration, 25th percentile of 2 interleaved rounds" in m for m in quiet.measured.values())
    quiet.provisional = ""  # whatever this machine was doing: a trusted cache is what is tested here
    quiet.path = tmp_path / "c.json"
    quiet.save()
    assert Calibration.read(quiet.path) == quiet
    # the file is also a cost table a replay can price on
    assert load_cost_table(quiet.path).seconds_by_batch == quiet.seconds


def test_a_start_beside_one_measuring_waits_for_its_figures_rather_than_measuring_too(
    context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two processes starting together on a fresh machine (a server and a run, a suite's two workers) measured the
    # same figures at once: twice the time, each disturbing the other's timings
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    how = "argmax" if context.backend_sampling else "logits"
    path = cache_path("e" * 64, CPU, N_MAX, how)
    theirs = Calibration({1: 0.5, 2: 0.75}, dict.fromkeys((1, 2), "the other process's"), CPU.name, path=path)
    said: list[str] = []
    got: list[Calibration] = []
    with measuring(path):  # as the other process holds it while it measures
        waiter = threading.Thread(target=lambda: got.append(load_or_measure(context, "e" * 64, CPU, N_MAX,
                                                                            say=said.append)))
        waiter.start()
        while not said:
            waiter.join(0.05)
        theirs.save()
    waiter.join()
    assert said == ["another localspec process is measuring this machine: waiting for its figures"]
    assert got == [theirs]  # read, not measured: a measurement would have said so and timed real passes


def test_a_lock_held_past_the_wait_is_passed_by(tmp_path: Path) -> None:
    # a process stopped mid-measurement (Ctrl-Z) holds its lock: a later start measures beside it after the wait
    with locked(tmp_path / "figures.json"):
        told: list[bool] = []
        with locked(tmp_path / "figures.json", wait=0.2, waiting=lambda: told.append(True)) as held:
            assert not held and told == [True]
    with locked(tmp_path / "figures.json", wait=0.2) as held:
        assert held


def live(calibrated: dict[int, float], passes: dict[int, list[float]]) -> PassCosts:
    costs = PassCosts(dict(calibrated))
    for n, seconds in passes.items():
        for s in seconds:
            costs.update(n, s)
    return costs


def test_live_passes_write_lower_figures_back_and_nothing_else() -> None:
    stored = Calibration({1: 0.05, 2: 0.10, 3: 0.12}, dict.fromkeys((1, 2, 3), "calibration"), "cpu", "busy")
    changed = stored.improve(live(stored.seconds, {1: [0.02] * 12, 2: [0.11] * 12, 3: [0.03]}))
    # size 1: proved lower by 12 passes; size 2: live is dearer (a live step does more than a bare pass), and
    # passes that verify a draft set the level; size 3: one pass proves nothing
    assert changed == [1] and stored.seconds == {1: 0.02, 2: 0.10, 3: 0.12}
    assert stored.measured[1].startswith("live, 25th percentile of 9 passes")  # the most recent ones


def test_a_calibration_every_pass_beats_is_written_back_at_the_live_level() -> None:
    """Sizes no pass used go down with the level too: written back alone, the used sizes would set the level at 1
    at the next start, and the rest would look as dear as before."""
    stored = Calibration({1: 0.05, 2: 0.10, 3: 0.12}, dict.fromkeys((1, 2, 3), "calibration"), "cpu")
    assert stored.improve(live(stored.seconds, {1: [0.02] * 12})) == [1, 2, 3]
    assert stored.seconds == pytest.approx({1: 0.02, 2: 0.04, 3: 0.048})
    assert "× 0.40 live" in stored.measured[2]


def test_the_figures_as_measured_stay_as_they_were_measured(tmp_path: Path) -> None:
    """What a seeded request prices on: live passes never change them, the file keeps them, and a file written
    before they were kept gives its figures as read."""
    measured = {1: 0.05, 2: 0.10, 3: 0.12}
    stored = Calibration(dict(measured), dict.fromkeys(measured, "calibration"), "cpu", path=tmp_path / "c.json")
    assert stored.improve(live(stored.seconds, {1: [0.02] * 12})) == [1, 2, 3]
    assert stored.as_measured == measured and stored.save()
    read = Calibration.read(stored.path)
    assert read is not None and read.as_measured == measured and read.seconds == stored.seconds
    data = json.loads(stored.path.read_text())
    del data["as_measured_by_batch"]
    stored.path.write_text(json.dumps(data))
    older = Calibration.read(stored.path)
    assert older is not None and older.as_measured == older.seconds == stored.seconds


def test_a_damaged_cache_is_measured_anew(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    for text in ("{oops", '{"seconds_by_batch": {}}', '{"seconds_by_batch": {"2": 0.1}}',
                 '{"seconds_by_batch": {"1": 0.1, "2": -1}}'):
        path.write_text(text)
        assert Calibration.read(path) is None, text


def test_the_cache_files_keep_their_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's calibration is found again after an upgrade only under the same file name: model hash, device,
    threads, offloaded layers, sizes, llama-cpp-python's version, method and how passes are read."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    folder, version, model = tmp_path / "cache" / "calibration", library_version(), "0123456789abcdef" * 4
    cpu = "AMD EPYC 7B13 64-Core Processor"
    on_cpu = Device(2, 0, False, "", cpu, "CPU (2 threads)")
    on_gpu = Device(16, 19, True, "", f"CUDA GPU, {cpu}", "GPU: all 18 layers offloaded (CUDA)")
    assert cache_path(model, on_cpu, 17, "argmax") == \
        folder / f"0123456789abcdef-amd-epyc-7b13-64-core-processor-t2-g0-n17-{version}-q5-argmax.json"
    assert cache_path(model, on_gpu, 17, "logits-steady") == \
        folder / f"0123456789abcdef-cuda-gpu-amd-epyc-7b13-64-core-processor-t16-g19-n17-{version}-q5-logits-steady" \
        ".json"
    assert cache_path(model, on_cpu, 7, "shapes").name.endswith(f"-t2-g0-n7-{version}-q5-shapes.json")


@pytest.mark.skipif(not backend_sampling_available(), reason="this llama-cpp-python has no backend sampler")
def test_greedy_passes_are_read_back_the_way_this_device_times_faster(
    context: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    context.clear()
    context.feed([2, 651, 6974])
    try:
        reads = choose_reads(context, "e" * 64, CPU, N_MAX)
        assert reads is not None and context.can_sample and context.backend_sampling == reads.ids
        assert set(reads.seconds["ids"]) == set(reads.seconds["logits"]) == {1, N_MAX}
        assert context.tokens == [2, 651, 6974]  # the cache as it was
        # the next start takes the choice from the cache, whatever state the context is in
        context.use_backend_sampler(not reads.ids)
        again = choose_reads(context, "e" * 64, CPU, N_MAX)
        assert again is not None and context.backend_sampling == again.ids
        if cache_path("e" * 64, CPU, N_MAX, "reads").exists():  # not if others were busy
            assert again == reads
        # either way, the same token at every position: the choice is about cost only
        rows = [651, 6974, 1234, 29, 4099]
        by_way = []
        for ids in (True, False):
            context.use_backend_sampler(ids)
            context.truncate(3)
            by_way.append(context.decode_argmax(rows[:N_MAX]))
        assert by_way[0] == by_way[1]
    finally:
        context.use_backend_sampler(True)
        context.clear()


def test_ctrl_c_stops_a_calibration_and_leaves_the_cache_as_it_was(context: Context) -> None:
    context.clear()
    context.feed([2, 651, 6974])
    with pytest.raises(KeyboardInterrupt):
        measure(context, N_MAX, cancelled=lambda: True)
    assert context.tokens == [2, 651, 6974]


def test_a_runtime_writes_its_corrected_pass_costs_back(model_path: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that claims every pass costs minutes is corrected by one generation, and the lower figures are in the
    file when the runtime closes. (Not a timing assertion: no machine takes a third of that for a pass.)"""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=512, n_gpu_layers=0),
                        SpeculationSettings(drafter="ngram"), SamplingSettings())
    inflated = {n: 100.0 + 5.0 * n for n in range(1, 18)}  # far above what a pass of this model costs anywhere
    device = _cpu(settings.runtime.threads())
    for how in ("argmax", "logits"):  # whichever way this machine reads passes back (choose_reads)
        path = cache_path(known_sha256(model_path), device, 17, how)
        Calibration(inflated, dict.fromkeys(inflated, "test"), "cpu", path=path).save()
    with Runtime.open(settings) as rt:
        assert rt.device == device
        path = cache_path(known_sha256(model_path), device, 17, "argmax" if rt.context.backend_sampling else "logits")
        assert rt.calibration is not None and rt.calibration.path == path  # the cache was used, not measured
        prompt = rt.prompt_tokens("Count: one two three four five six seven eight nine ten. Again: one two three")
        list(rt.generator.generate(prompt, GenerationSettings(max_tokens=24)))
        assert rt.generator.policy.costs(1) < inflated[1] / 3  # the live level, not the cache's
    stored = Calibration.read(path)
    assert stored is not None and stored.seconds[1] < inflated[1] / 3 and stored.measured[1].startswith("live")


def test_calibrate_command_shows_the_figures_how_they_were_measured_and_pass_shapes(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    figures = {n: 0.01 * n for n in range(1, 18)}
    threads = usable_cores()  # (more threads than cores would make the shapes' timing minutes long)
    for how in ("argmax", "logits"):  # whichever way this machine reads passes back (choose_reads)
        path = cache_path(known_sha256(model_path), _cpu(threads), 17, how)
        Calibration(figures, dict.fromkeys(figures, "how"), "cpu", provisional="busy", path=path).save()
    result = CliRunner().invoke(app, ["calibrate", "--show", "--shapes", "--model", str(model_path), "--threads",
                                      str(threads), "--gpu-layers", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    warmup = lines.index(next(line for line in lines if "warm-up" in line))
    rows = [line.split() for line in lines[2:warmup]]
    assert [(int(r[0]), float(r[1])) for r in rows] == [(n, round(s * 1000, 2)) for n, s in figures.items()]
    assert all(r[-1] == "how" for r in rows)
    assert "provisional: busy" in result.stderr and "-q5-" in result.stderr  # shown, not measured again
    assert "greedy passes read back as" in result.stderr
    # --shapes: passes of a steady size against passes after a change; a CPU keeps no sizes
    assert [int(line.split()[0]) for line in lines[warmup + 2:]] == [1, 2, 4]
    assert "no CUDA graphs on this device: every draft length is its own pass size" in result.stderr


def test_steady_and_after_change_passes_are_timed_and_the_cache_left_as_it_was(context: Context) -> None:
    context.feed([2, 651, 6037])
    before = list(context.tokens)
    timing = measure_shapes(context, sizes=(1, 2), rounds=1)
    assert context.tokens == before
    assert set(timing.seconds) == {"after change", "capture", "steady"}
    assert all(set(by) == {1, 2} and min(by.values()) > 0 for by in timing.seconds.values())
    # a CPU runs no CUDA graphs: localspec keeps no pass sizes there, and times nothing to find that out
    assert load_or_measure_shapes(context, "0" * 64, CPU, N_MAX) == Shapes()


# ---- the same prompt, the same passes, whatever the timing noise ------------------------------------------------


class NoisyTable:
    """A cost table whose live passes carry noise: jitter, and now and then a pass several times as slow."""

    def __init__(self, table: CostTable, seed: int) -> None:
        self.table, self.rng = table, random.Random(seed)

    def step(self, n: int, stage: int = STEADY) -> float:
        return noisy(self.table.step(n, stage), self.rng)

    def shapes(self, n_max: int) -> Shapes:
        return self.table.shapes(n_max)

    def calibration(self, n_max: int) -> dict[int, float]:
        return self.table.calibration(n_max)


def calibrated(seconds: dict[int, float]) -> DraftPolicy:
    policy = DraftPolicy(k_max=16)
    policy.calibrate(seconds)
    return policy


@pytest.fixture(scope="module")
def grounded(model_path: Path) -> tuple[list[int], list[int]]:
    """A grounded prompt of the built-in suite and the real model's greedy answer to it."""
    prompt = next(p for p in load_suite(None).prompts if p.id == "refactor-rename")
    settings = Settings(str(model_path), RuntimeSettings(n_ctx=1024), SpeculationSettings(drafter="ngram", k=8),
                        SamplingSettings())
    with Runtime.open(settings) as rt:
        tokens = rt.prompt_tokens(prompt.prompt)
        events = rt.generator.generate(tokens, GenerationSettings(max_tokens=prompt.max_tokens))
        return tokens, [t.id for e in events if isinstance(e, Step) for t in e.emitted]


def test_repeated_runs_with_timing_noise_make_about_the_same_passes(grounded: tuple[list[int], list[int]]) -> None:
    """Eight runs of one grounded prompt, each with its own noise, half from a calibration taken on a busy
    machine: every run's passes within 15% of their median."""
    prompt, output = grounded
    table = load_cost_table("epyc-avx2-2t")
    passes = [replay("ngram", prompt, output, NoisyTable(table, seed),  # type: ignore[arg-type]
                     policy=calibrated(busy(seed=seed) if seed % 2 else table.calibration(17))).target_passes
              for seed in range(8)]
    middle = statistics.median(passes)
    assert all(abs(p - middle) <= 0.15 * middle for p in passes), passes
    assert middle < 0.8 * len(output)  # and drafting paid: the prompt is one a lookup copies from


def test_on_the_replays_known_target_a_busy_calibration_converges_to_the_quiet_curve(
    grounded: tuple[list[int], list[int]],
) -> None:
    """One replayed generation (noisy passes, a calibration 2.5x too high): by its end, every size it verified is
    within 10% of what a quiet pass of that size costs, and the sizes it did not use are at the quiet level too."""
    prompt, output = grounded
    table = load_cost_table("epyc-avx2-2t")
    policy = calibrated(busy(seed=3))
    stats = replay("ngram", prompt, output, NoisyTable(table, 3), policy=policy)  # type: ignore[arg-type]
    assert stats.target_passes <= 64  # the bound: one generation of 160 tokens
    used = policy.costs.live()
    assert len(used) >= 2
    for n in range(1, 18):
        assert policy.costs(n) == pytest.approx(table.step(n), rel=0.10 if n in used else 0.15), n
