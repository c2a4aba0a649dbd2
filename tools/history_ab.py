#!/usr/bin/env python3
"""Same-run A/B of drafts from earlier requests against the n-gram drafter of another commit (issue 34's goals).

    git archive 1a3f1f9 localspec | tar -x -C /tmp/at      # the baseline's package
    PYTHONPATH=. python tools/history_ab.py --baseline /tmp/at --suite template-emails --suite tool-calls

Each suite runs in order as one job (one process per job, the model loaded once): one at a time with Runtime, or
with --batch as one batch on BatchRuntime (as `localspec batch` runs a file), drafter ngram, greedy. The two codes
alternate ABBA per round on the same machine, so drift hits both alike. The history is in memory only
(LOCALSPEC_HISTORY=memory): nothing on disk is read or written. Reported: tok/s of the job's first and second halves
(generated tokens over decode seconds; a batch's halves by the order its requests finished, over the job's wall
time) and the ratio new / baseline, each round's beside the sum. --steps: no A/B, what this checkout's drafts did
per half (tokens a pass, each draft kind's steps and accepted tokens; with --batch, the scheduler's passes and rows
over the job): where a change shows before its speed does, with the history in memory (or off, with
LOCALSPEC_HISTORY=off), never on disk whatever the shell set: there a prompt would draft from its own earlier runs.
Self-contained: only localspec's public runtime classes and the suites.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


class _Prompt:
    def __init__(self, prompt: str, max_tokens: int) -> None:
        self.prompt, self.max_tokens = prompt, max_tokens


def one(suite: str, batch: bool, max_tokens: int | None) -> dict:
    """Run ``suite`` as one job with the localspec on sys.path: per half, tokens and seconds, and (``steps``) target
    passes, drafts from earlier requests drafted / accepted, and per draft kind [steps, accepted, drafted] (one at a
    time only: a batch's results carry no steps)."""
    from localspec.settings import GenerationSettings, RuntimeSettings, Settings, SpeculationSettings

    # read here, not by the package: the baseline's does not know these suites
    file = Path(suite) if Path(suite).exists() else HERE / "localspec" / "bench_suites" / f"{suite}.jsonl"
    prompts = [_Prompt(d["prompt"], max_tokens or d.get("max_tokens", 128))
               for d in map(json.loads, file.read_text(encoding="utf-8").splitlines()) if d]
    settings = Settings(None, RuntimeSettings(n_ctx=2048), SpeculationSettings(drafter="ngram"))
    cut = len(prompts) // 2
    out: dict = {"first": [0.0, 0.0], "second": [0.0, 0.0]}
    # host: seconds planning a step (the propose, the policy's trim and pad), and the rest of the loop's own Python
    # (decoding time less the passes with their verifying and rollback, and less the planning: the policy's observe,
    # the emit, the drafters' accept, and this tool's handling of the events)
    steps = {half: {"passes": 0, "cache": [0, 0], "drafts": [0, 0], "kinds": {}, "host": [0.0, 0.0]}
             for half in ("first", "second")}
    out["steps"] = steps

    def count(half: str, stats: object) -> None:
        steps[half]["passes"] += stats.target_passes  # type: ignore[attr-defined]
        steps[half]["cache"][0] += getattr(stats, "cache_drafted", 0)
        steps[half]["cache"][1] += getattr(stats, "cache_accepted", 0)
        steps[half]["drafts"][0] += stats.drafted  # type: ignore[attr-defined]
        steps[half]["drafts"][1] += stats.accepted  # type: ignore[attr-defined]
        if not batch:  # a batch's sequences share their passes: the host time around them is the scheduler's
            draft, verify = getattr(stats, "draft_seconds", 0.0), getattr(stats, "verify_seconds", 0.0)
            steps[half]["host"][0] += draft
            steps[half]["host"][1] += max(0.0, stats.decode_seconds - verify - draft)  # type: ignore[attr-defined]

    if batch:
        from localspec.batch.run import run_requests
        from localspec.request import Request
        from localspec.runtime import BatchRuntime

        # the scheduler's passes and rows, where the code counts them (not a baseline's that cannot)
        passes = None
        if "stats" in inspect.signature(run_requests).parameters:
            from localspec.speculative.jobs import PassStats

            passes = PassStats()
        with BatchRuntime.open(settings, None, jobs=len(prompts)) as rt:
            requests = [Request(str(i), prompt=p.prompt, max_tokens=p.max_tokens) for i, p in enumerate(prompts)]
            t0 = time.perf_counter()
            ends = []
            for result in run_requests(rt, requests, **({"stats": passes} if passes is not None else {})):
                ends.append((time.perf_counter() - t0, len(result.tokens)))
                count("first" if len(ends) <= cut else "second", result.stats)
        # the halves by the order requests finished: the first ``cut`` of them, over the time until the last did
        out["first"] = [sum(n for _, n in ends[:cut]), ends[cut - 1][0]]
        out["second"] = [sum(n for _, n in ends[cut:]), ends[-1][0] - ends[cut - 1][0]]
        out["batch"] = ([passes.passes, passes.rows, getattr(passes, "prompt_passes", 0), passes.prefill_tokens,
                         getattr(passes, "prompt_seconds", 0.0), getattr(passes, "seconds", 0.0)]
                        if passes is not None else None)
        return out
    from localspec.events import Finished, Step
    from localspec.runtime import Runtime

    with Runtime.open(settings) as rt:
        for i, p in enumerate(prompts):
            name = "first" if i < cut else "second"
            for event in rt.generate(rt.prompt_tokens(p.prompt), GenerationSettings(max_tokens=p.max_tokens)):
                if isinstance(event, Step) and event.k:
                    kind = steps[name]["kinds"].setdefault(getattr(event, "kind", "") or event.drafter, [0, 0, 0])
                    kind[0] += 1
                    kind[1] += len(event.accepted)
                    kind[2] += len(event.accepted) + len(event.rejected)
                if isinstance(event, Finished):
                    out[name][0] += event.stats.generated_tokens
                    out[name][1] += event.stats.decode_seconds
                    count(name, event.stats)
    return out


def child(code: Path, suite: str, batch: bool, max_tokens: int | None) -> dict[str, list[float]]:
    # the code's package first; the rest of the path stays (a GPU machine's llama-cpp-python and wheels live there)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != HERE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *rest]), "LOCALSPEC_HISTORY": "memory"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--suite", suite]
    cmd += ["--batch"] * batch + (["--max-tokens", str(max_tokens)] if max_tokens else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="the baseline's folder holding its localspec package")
    parser.add_argument("--suite", action="append", default=[])
    parser.add_argument("--batch", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--steps", action="store_true",
                        help="no A/B: run each suite once with this checkout (the history in memory, or off with "
                             "LOCALSPEC_HISTORY=off; each prompt once) "
                             "and print, per half, tokens a pass, tok/s, drafts from earlier requests and each kind")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.suite[0], args.batch, args.max_tokens)))
        return
    if args.steps:
        # in memory, or off where asked: never the disk's, where a prompt would draft from its own earlier runs
        if os.environ.get("LOCALSPEC_HISTORY", "").strip().lower() != "off":
            os.environ["LOCALSPEC_HISTORY"] = "memory"
        for suite in args.suite:
            got = one(suite, args.batch, args.max_tokens)
            for half in ("first", "second"):
                (tokens, seconds), st = got[half], got["steps"][half]
                print(f"{suite} {half} half: {tokens:.0f} tokens, {st['passes']} passes, "
                      f"{tokens / max(1, st['passes']):.2f} tokens a pass, {tokens / seconds:.1f} tok/s; "
                      f"{st['drafts'][1]} of {st['drafts'][0]} drafted tokens accepted "
                      f"({st['drafts'][1] / max(1, st['drafts'][0]):.0%}), from earlier requests {st['cache'][1]} of "
                      f"{st['cache'][0]}")
                if not args.batch:
                    draft, other = (1e6 * x / max(1, st["passes"]) for x in st["host"])
                    print(f"  host a pass: drafting {draft:.0f} µs, the rest of the loop {other:.0f} µs")
                for kind, (n, acc, drafted) in sorted(st["kinds"].items()):
                    print(f"  {kind}: {n} steps, {acc} of {drafted} drafted tokens accepted")
            if got.get("batch"):
                n, rows, prompt_passes, prompt_tokens, prompt_seconds, seconds = got["batch"]
                tokens = got["first"][0] + got["second"][0]
                print(f"{suite} as one batch: {n} passes, {rows / max(1, n):.1f} rows and "
                      f"{tokens / max(1, n):.1f} tokens a pass; {prompt_passes} passes carried a prompt chunk "
                      f"({prompt_tokens} prompt tokens computed), {prompt_seconds:.2f} of the passes' {seconds:.2f} s")
        return
    codes = {"baseline": args.baseline, "new": HERE}
    summed = {name: [0.0, 0.0] for name in codes}
    for suite in args.suite:
        got: dict[str, dict[str, list[float]]] = {name: {"first": [0.0, 0.0], "second": [0.0, 0.0]} for name in codes}
        rounds: list[float] = []  # each round's second-half ratio: the spread between rounds of one sitting
        for r in range(args.rounds):
            order = ["baseline", "new", "new", "baseline"]
            mine: dict[str, list[float]] = {name: [0.0, 0.0] for name in codes}
            for name in order if r % 2 == 0 else order[::-1]:
                res = child(codes[name], suite, args.batch, args.max_tokens)
                for half in ("first", "second"):
                    got[name][half][0] += res[half][0]
                    got[name][half][1] += res[half][1]
                mine[name][0] += res["second"][0]
                mine[name][1] += res["second"][1]
            rounds.append((mine["new"][0] / mine["new"][1]) / (mine["baseline"][0] / mine["baseline"][1]))
        rate = {name: {h: t / s if s else 0.0 for h, (t, s) in got[name].items()} for name in codes}
        for name in codes:
            summed[name][0] += got[name]["second"][0]
            summed[name][1] += got[name]["second"][1]
        whole = {name: sum(got[name][h][0] for h in got[name]) / sum(got[name][h][1] for h in got[name])
                 for name in codes}
        print(f"{suite}{' (batch)' if args.batch else ''}: whole job {whole['baseline']:.1f} -> {whole['new']:.1f} "
              f"tok/s ({whole['new'] / whole['baseline']:.2f}x); first half {rate['baseline']['first']:.1f} -> "
              f"{rate['new']['first']:.1f} tok/s ({rate['new']['first'] / rate['baseline']['first']:.2f}x); second "
              f"half {rate['baseline']['second']:.1f} -> {rate['new']['second']:.1f} tok/s "
              f"({rate['new']['second'] / rate['baseline']['second']:.2f}x; rounds "
              f"{', '.join(f'{x:.2f}x' for x in rounds)})", flush=True)
    base, new = (summed[n][0] / summed[n][1] for n in ("baseline", "new"))
    print(f"second halves summed: {base:.1f} -> {new:.1f} tok/s ({new / base:.2f}x)")


if __name__ == "__main__":
    main()
