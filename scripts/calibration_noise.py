#!/usr/bin/env python3
"""How much a calibration taken on a busy machine, and run-to-run timing noise, move n-gram's speed (issue #19).

Measures this machine's pass costs twice (quietly, and beside two processes that keep both cores busy), then runs
the grounded prompts of the built-in suite, target-only and n-gram, 3 times each (interleaved), once with each
calibration in the cache, and prints per prompt the spread of n-gram's target passes and of its speedup.

    .venv/bin/python scripts/calibration_noise.py --measure   # the two calibrations, into bench-out/
    .venv/bin/python scripts/calibration_noise.py             # the runs, with this checkout's code
    .venv/bin/python scripts/calibration_noise.py --replay    # no timing at all: the same answers replayed on the
                                                              # EPYC table with injected noise, 8 seeds per prompt

The busy calibration is put in the cache as if it had been trusted: what is tested is what the live correction does
with it. To run the same figures through an earlier commit's code:

    git worktree add ../before 4a14e7c
    PYTHONPATH=../before .venv/bin/python scripts/calibration_noise.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import localspec
from localspec.bench.suite import load_suite
from localspec.events import Finished, Step
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings, RuntimeSettings, SamplingSettings, Settings, SpeculationSettings

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench-out"


def settings(drafter: str) -> Settings:
    from localspec.models.embedded import ensure_default_model

    return Settings(str(ensure_default_model(progress=False)), RuntimeSettings(), SpeculationSettings(drafter=drafter),
                    SamplingSettings())


def measure_both() -> None:
    from localspec.speculative.calibrate import measure

    with Runtime.open(settings("none")) as rt:
        quiet = measure(rt.context, 17).seconds
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            busy = measure(rt.context, 17).seconds
        finally:
            for p in spinners:
                p.kill()
    for name, seconds in (("quiet", quiet), ("busy", busy)):
        (OUT / f"calibration-{name}.json").write_text(json.dumps({str(n): s for n, s in seconds.items()}))
        print(name, " ".join(f"{n}:{s * 1000:.0f}" for n, s in seconds.items()))


def install(seconds: dict[int, float], home: Path) -> None:
    """Put ``seconds`` where the running code's calibration cache looks, as a measurement it trusts."""
    os.environ["LOCALSPEC_HOME"] = str(home)
    with Runtime.open(settings("none")) as rt:
        from localspec.models.files import known_sha256
        from localspec.speculative import calibrate as c

        args = (known_sha256(rt.model.path), rt.settings.runtime.threads(), 0, 17, rt.context.backend_sampling)
        if not isinstance(rt.device, str):  # this checkout: the cache keyed by the runtime's Device
            how = "argmax" if rt.context.backend_sampling else "logits"
            c.Calibration(dict(seconds), dict.fromkeys(seconds, "scripts/calibration_noise.py"), rt.device.name,
                          path=c.cache_path(args[0], rt.device, 17, how)).save()
        elif hasattr(c, "Calibration"):  # before the Device: figures with how and when they were measured
            device = c.device_name(0)
            path = c.cache_path(args[0], device, *args[1:])
            c.Calibration(dict(seconds), dict.fromkeys(seconds, "scripts/calibration_noise.py"), device,
                          path=path).save()
        else:  # before issue #19: a flat {n: seconds} file
            path = c._cache_file(*args)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({str(n): s for n, s in seconds.items()}))


def run(seconds: dict[int, float], repeat: int) -> dict[str, list[tuple[int, float]]]:
    """prompt id → (n-gram's target passes, its speedup over target-only in the same repeat), per repeat."""
    prompts = [p for p in load_suite(None).prompts if p.category == "grounded"]
    out: dict[str, list[tuple[int, float]]] = {p.id: [] for p in prompts}
    with tempfile.TemporaryDirectory() as home:
        install(seconds, Path(home))
        with Runtime.open(settings("ngram")) as rt:
            for _ in range(repeat):
                for p in prompts:
                    tokens = rt.prompt_tokens(p.prompt)
                    stats = {}
                    for drafter in ("none", "ngram"):
                        rt.set_drafter(drafter)
                        rt.fresh(clear_cache=True)
                        events = rt.generate(tokens, GenerationSettings(max_tokens=p.max_tokens))
                        stats[drafter] = [e for e in events if isinstance(e, Finished)][-1].stats
                    out[p.id].append((stats["ngram"].target_passes,
                                      stats["none"].decode_seconds / stats["ngram"].decode_seconds))
    return out


def replay_with_noise() -> None:
    """Each grounded prompt's answer (generated once, n-gram k=8) drafted again by the adaptive policy, against a
    target whose every pass costs the EPYC table's figure with noise (4% jitter; 8% of passes 2–8x slow), from a
    quiet calibration and from one 2.5x too high. Only APIs the code before issue #19 had too, so both can run it."""
    import random

    from localspec.bench.replay import _Clock, _KnownTarget, _NoText, load_cost_table
    from localspec.runtime import lookup_drafters
    from localspec.speculative.loop import Generator
    from localspec.speculative.policy import DraftPolicy

    table = load_cost_table("epyc-avx2-2t")
    quiet = table.calibration(17)

    class Noisy:
        def __init__(self, seed: int) -> None:
            self.rng = random.Random(seed)

        def step(self, n: int) -> float:
            slow = self.rng.uniform(2.0, 8.0) if self.rng.random() < 0.08 else 1 + abs(self.rng.gauss(0.0, 0.04))
            return table.step(n) * slow

    def passes(prompt: list[int], output: list[int], cost: object, calibration: dict[int, float]) -> int:
        policy = DraftPolicy(k_max=16)
        policy.calibrate(calibration)
        clock = _Clock()
        generator = Generator(_KnownTarget([*prompt, *output], cost, clock, eog=False), _NoText(),  # type: ignore[arg-type]
                              lookup_drafters("ngram"), SamplingSettings(), policy, clock)
        events = generator.generate(prompt, GenerationSettings(max_tokens=len(output)))
        return [e for e in events if isinstance(e, Finished)][-1].stats.target_passes

    answers = grounded_answers()
    print(f"code: {Path(localspec.__file__).resolve().parents[1]}; n-gram target passes, 8 noise seeds")
    print("| prompt | tokens | no noise | noisy, quiet calibration | noisy, calibration 2.5x too high |")
    print("|---|---|---|---|---|")
    for pid, (prompt, output) in answers.items():
        noisy_quiet = [passes(prompt, output, Noisy(s), quiet) for s in range(8)]
        noisy_busy = [passes(prompt, output, Noisy(s), {n: v * 2.5 for n, v in quiet.items()}) for s in range(8)]
        print(f"| {pid} | {len(output)} | {passes(prompt, output, table, quiet)} | "
              f"{spread(noisy_quiet, '{}')} | {spread(noisy_busy, '{}')} |")


def grounded_answers() -> dict[str, tuple[list[int], list[int]]]:
    """The real model's greedy answers to the grounded prompts (n-gram, k=8), generated once into bench-out/."""
    cache = OUT / "grounded-answers.json"
    if cache.exists():
        return {k: (v[0], v[1]) for k, v in json.loads(cache.read_text()).items()}
    answers = {}
    fixed = settings("ngram")
    fixed = Settings(fixed.model, fixed.runtime, SpeculationSettings(drafter="ngram", k=8), fixed.sampling)
    with Runtime.open(fixed) as rt:
        for p in load_suite(None).prompts:
            if p.category == "grounded":
                tokens = rt.prompt_tokens(p.prompt)
                events = rt.generate(tokens, GenerationSettings(max_tokens=p.max_tokens))
                answers[p.id] = (tokens, [t.id for e in events if isinstance(e, Step) for t in e.emitted])
    cache.write_text(json.dumps(answers))
    return answers


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", action="store_true", help="measure the quiet and the busy calibration")
    ap.add_argument("--replay", action="store_true", help="replay the answers with injected noise (no timing)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    if args.measure:
        measure_both()
        return
    if args.replay:
        replay_with_noise()
        return
    results = {}
    for name in ("quiet", "busy"):
        seconds = {int(n): s for n, s in json.loads((OUT / f"calibration-{name}.json").read_text()).items()}
        results[name] = run(seconds, args.repeat)
    code = Path(localspec.__file__).resolve().parents[1]
    print(f"code: {code}; n-gram, {args.repeat} runs per prompt and calibration")
    print("| prompt | passes, quiet cache | passes, busy cache | speedup, quiet cache | speedup, busy cache | "
          "busy ÷ quiet (median speedup) |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for pid in results["quiet"]:
        q, b = results["quiet"][pid], results["busy"][pid]
        ratio = statistics.median(s for _, s in b) / statistics.median(s for _, s in q)
        ratios.append(ratio)
        print(f"| {pid} | {spread([p for p, _ in q], '{}')} | {spread([p for p, _ in b], '{}')} | "
              f"{spread([s for _, s in q], '{:.2f}x')} | {spread([s for _, s in b], '{:.2f}x')} | {ratio:.3f} |")
    print(f"| median | | | | | {statistics.median(ratios):.3f} |")


if __name__ == "__main__":
    main()
