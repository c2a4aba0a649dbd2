#!/usr/bin/env python3
"""What a seed costs: sampled generation with a seed (draft lengths priced on the pass costs as measured, no drafts
from earlier requests) against the same without a seed (live-corrected costs; the history off, so neither drafts
from it), and against the same seeds priced live as before the seed's promise (``seeded-live``: the same random
streams, so nearly the same texts: the fairer pair).

    .venv/bin/python tools/seed_cost.py [--repeats 3] [--temperature 0.8] [--drafter ngram] [--ids a,b]
                                        [--threads N] [--gpu-layers N]

Each generation starts from the stored calibration, as a fresh `localspec run` does; modes interleaved, each
prompt's seeds shared by the two seeded modes. Prints tokens a second per mode, summed over all generations
(generated tokens ÷ decode seconds), per-prompt medians, and the ratios; and the same passes priced on the stored
figures (load-free: what the draft lengths chosen are worth where passes cost what the calibration says). Writes
nothing back to the cache: the runtimes are not closed through the path that saves corrected pass costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import localspec  # noqa: F401  (first: llama.cpp's libraries before numpy)
from localspec.events import Finished, Step
from localspec.models.embedded import ensure_default_model
from localspec.runtime import Runtime
from localspec.settings import (
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)

PROMPTS = Path(__file__).resolve().parents[1].parent / "shared" / "bench" / "prompts.jsonl"
DEFAULT_IDS = "repeat-lighthouse,extract-invoice,code-rename,summary-quotes,code-complete"
MODES = ("unseeded", "seeded", "seeded-live")


def reprice(rt: Runtime, mode: str) -> None:
    """Start the next generation as a fresh process would: nothing learned, the stored pass costs (as measured for
    a seeded request; as corrected by earlier runs otherwise, and corrected live from there)."""
    rt.fresh()
    policy, calibration = rt.generator.policy, rt.calibration
    assert calibration is not None
    if mode == "seeded-live":
        policy.reproducible = False
    policy.calibrate(calibration.as_measured if mode == "seeded" else calibration.seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, default=PROMPTS)
    ap.add_argument("--ids", default=DEFAULT_IDS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=None, help="default: all where the build offloads")
    args = ap.parse_args()

    wanted = args.ids.split(",")
    rows = {d["id"]: d for d in map(json.loads, args.prompts.read_text().splitlines()) if d["id"] in wanted}
    model = str(ensure_default_model(progress=False))
    runtimes: dict[str, Runtime] = {}
    for mode in MODES:
        sampling = SamplingSettings(temperature=args.temperature, seed=None if mode == "unseeded" else 0)
        settings = Settings(model, RuntimeSettings(n_ctx=2048, n_threads=args.threads, n_gpu_layers=args.gpu_layers),
                            SpeculationSettings(drafter=args.drafter), sampling, history=HistorySettings("off"))
        runtimes[mode] = Runtime.open(settings)
    totals = {m: [0, 0.0] for m in MODES}
    # the same passes priced on the stored figures as measured: what the choices are worth where every pass costs
    # what the calibration says (a shared machine's load moves the live figures far more than a policy does)
    figures = runtimes["seeded"].calibration.as_measured  # type: ignore[union-attr]
    priced = {m: [0, 0.0] for m in MODES}
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.repeats):
        for i, (pid, row) in enumerate(rows.items()):
            seed = 1000 * r + i
            order = MODES[r % 3:] + MODES[: r % 3]  # each mode goes first, second and third in turn
            for mode in order:
                rt = runtimes[mode]
                reprice(rt, mode)
                rt.generator.sampling = replace(rt.settings.sampling, seed=None if mode == "unseeded" else seed)
                prompt = rt.prompt_tokens(row["prompt"])
                events = list(rt.generate(prompt, GenerationSettings(max_tokens=row["max_tokens"])))
                stats = next(e.stats for e in events if isinstance(e, Finished))
                passes = [min(e.k + 1, max(figures)) for e in events if isinstance(e, Step)]
                totals[mode][0] += stats.generated_tokens
                totals[mode][1] += stats.decode_seconds
                priced[mode][0] += stats.generated_tokens
                priced[mode][1] += sum(figures[n] for n in passes)
                rates.setdefault((pid, mode), []).append(stats.tokens_per_second)
                print(f"{pid:18} {mode:12} seed {seed if mode != 'unseeded' else '-':>5} "
                      f"{stats.generated_tokens:4} tokens {stats.tokens_per_second:6.1f} tok/s "
                      f"{stats.drafted:4} drafted {stats.accepted:4} accepted {len(passes):4} passes", flush=True)
    print("\nmedian tok/s per prompt:")
    print(f"{'prompt':18} " + " ".join(f"{m:>12}" for m in MODES))
    for pid in rows:
        print(f"{pid:18} " + " ".join(f"{statistics.median(rates[(pid, m)]):12.1f}" for m in MODES))
    summed = {m: t / s for m, (t, s) in totals.items()}
    print("\nsummed: " + ", ".join(f"{m} {summed[m]:.1f} tok/s ({totals[m][0]} tokens)" for m in MODES))
    print(f"seeded ÷ unseeded {summed['seeded'] / summed['unseeded']:.3f}; "
          f"seeded ÷ seeded-live {summed['seeded'] / summed['seeded-live']:.3f}")
    at = {m: t / s for m, (t, s) in priced.items()}
    print("priced on the stored figures: " + ", ".join(f"{m} {at[m]:.1f} tok/s" for m in MODES))
    print(f"seeded ÷ unseeded {at['seeded'] / at['unseeded']:.3f}; "
          f"seeded ÷ seeded-live {at['seeded'] / at['seeded-live']:.3f}")
    for rt in runtimes.values():
        rt.calibration = None  # nothing written back: the next sitting starts from the same figures
        rt.close()


if __name__ == "__main__":
    main()
