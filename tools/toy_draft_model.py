"""A draft model on a device with pass shapes, priced on the toy of tests/test_shapes.py (no GPU, no draft model in
the replay): a target priced like the H100 table (1 row 1.1 ms + 0.12 ms a row, +0.55 ms right after a change of
size), a draft model whose passes cost PER_TOKEN each, scaled the same way. Prints tokens per second, drafted and
accepted tokens and the target's size changes, for draft models from good (noise 0.3) to useless (3.0).

    .venv/bin/python tools/toy_draft_model.py                              # this checkout
    .venv/bin/python tools/toy_draft_model.py --code bench-out/at/COMMIT   # another commit's localspec (a worktree)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", type=Path, help="import localspec from this tree instead (the toy stays this "
                                              "checkout's: an older commit may not have it)")
    ap.add_argument("--tokens", type=int, default=200, help="tokens generated per prompt")
    args = ap.parse_args()
    if args.code is not None:
        sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(args.code))
        import localspec  # noqa: F401  (bound to that tree before this checkout's tests package is put in front)
    sys.path.insert(0, str(ROOT))

    import numpy as np

    from localspec.drafters.model import ModelDrafter
    from localspec.events import Finished
    from localspec.settings import GenerationSettings, SamplingSettings
    from localspec.speculative.loop import Generator
    from localspec.speculative.policy import DraftPolicy
    from tests.test_shapes import KEPT, PROMPTS, STEADY_S, TARGET, _Sized
    from tests.toy import ToyModel

    print("| draft model noise | its cost a token | tok/s | drafted | accepted | size changes / passes |")
    print("|---|---|---|---|---|---|")
    for noise in (0.3, 1.0, 2.0, 3.0):
        for per_token in (0.2e-3, 0.5e-3):
            seconds = tokens = drafted = accepted = changes = passes = 0.0
            for prompt in PROMPTS:
                target, drafts = _Sized(TARGET), _Sized(ToyModel(seed=2, noise_from=TARGET, noise=noise))
                policy = DraftPolicy(k_max=16, shapes=KEPT)
                policy.calibrate(STEADY_S)
                policy.calibrate_drafter("draft", per_token)
                model = ModelDrafter(drafts, SamplingSettings(), np.random.default_rng(0), owns_model=False)  # type: ignore[arg-type]

                def clock(t: _Sized = target, d: _Sized = drafts, c: float = per_token) -> float:
                    return t.now + d.now * c / STEADY_S[1]

                gen = Generator(target, TARGET, [model], SamplingSettings(), policy, clock=clock)  # type: ignore[arg-type]
                end = [e for e in gen.generate(prompt, GenerationSettings(max_tokens=args.tokens))
                       if isinstance(e, Finished)][-1]
                seconds += clock()
                tokens += end.stats.generated_tokens
                drafted += end.stats.drafted
                accepted += end.stats.accepted
                sizes = target.sizes
                changes += sum(a != b for a, b in zip(sizes, sizes[1:], strict=False))
                passes += len(sizes)
            print(f"| {noise} | {per_token * 1e3:.1f} ms | {tokens / seconds:.0f} | {drafted:.0f} | {accepted:.0f} "
                  f"| {changes:.0f} / {passes:.0f} |")


if __name__ == "__main__":
    main()
