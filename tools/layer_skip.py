"""Which blocks can a layer-skip draft leave out, and would it pay on this machine?

For one target: its greedy text for a few prompts, once; then, for each candidate subset of its blocks (built and
cached as `--drafter layer-skip` builds it), one teacher-forced pass over prompt + text with logits at every text
position. Where the subset's argmax equals the target's next token, a 1-token draft would have been accepted; runs
of agreement give what k drafts yield a step (greedy drafts are accepted up to the first disagreement, exactly).

Priced by this machine's passes, timed here with the target's and the draft's passes interleaved (a loaded machine
disturbs both alike; a low quantile is kept): a step of k drafts costs k single-row draft passes and one target pass
of k + 1 rows, against k + 1... tokens at one target pass each without drafts. Acceptance does not depend on load.

    .venv/bin/python tools/layer_skip.py --model qwen2.5-coder-1.5b-instruct-q4_k_m --suite code-boilerplate
    .venv/bin/python tools/layer_skip.py --suite default            # the embedded Gemma 3 270M
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import localspec  # noqa: F401  (llama.cpp's libraries before numpy: README 'GPU')
from localspec.bench.suite import load_suite
from localspec.drafters.layer_skip import Subset, layer_skip_model
from localspec.engine import Context, Model
from localspec.opening import resolve
from localspec.speculative.calibrate import timed_pass, timing_history
from localspec.speculative.costs import low_quantile

K_MAX = 4  # drafts a step; the target's passes are timed up to K_MAX + 1 rows


@dataclass
class Row:
    subset: str
    kept: int
    agreement: float  # top-1 agreement with the target's next token (a 1-token draft's acceptance)
    tokens_a_step: dict[int, float]  # k → expected tokens a step (accepted drafts + the target's own)
    cost_ratio: float  # a single-row draft pass ÷ a single-row target pass
    speed: dict[int, float]  # k → expected speed ÷ target-only

    def best(self) -> tuple[int, float]:
        return max(self.speed.items(), key=lambda kv: kv[1])


def greedy_texts(ctx: Context, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The target's own greedy continuation of each prompt, one token a pass (as target-only decoding makes it)."""
    texts = []
    for prompt in prompts:
        ctx.clear()
        token, out = int(ctx.decode(prompt).argmax()), []
        while len(out) < max_tokens and not ctx.model.vocab.is_eog(token):
            out.append(token)
            token = int(ctx.decode([token])[0].argmax())
        texts.append(out)
    return texts


def agreement(ctx: Context, prompts: list[list[int]], texts: list[list[int]]) -> list[list[bool]]:
    """Per text position: does the draft's argmax, given the target's own prefix, equal the target's token?"""
    found = []
    for prompt, text in zip(prompts, texts):
        ctx.clear()
        ctx.feed(prompt[:-1])
        rows = ctx.decode([prompt[-1], *text[:-1]], all_logits=True)
        found.append((rows.argmax(axis=1) == text).tolist())
    return found


def tokens_a_step(agrees: list[list[bool]], k: int) -> float:
    """Expected tokens a step with k drafts: 1 (the target's own) + the run of agreements from each position, up
    to k, averaged over every position a step could start at."""
    steps = []
    for row in agrees:
        for i in range(len(row)):
            run = 0
            while run < k and i + run < len(row) and row[i + run]:
                run += 1
            steps.append(1 + run)
    return statistics.fmean(steps)


def time_passes(target: Context, draft: Context, rounds: int) -> tuple[dict[int, float], float]:
    """The target's passes of 1..K_MAX + 1 rows and the draft's single-row pass, interleaved over ``rounds``."""
    t: dict[int, list[float]] = {n: [] for n in range(1, K_MAX + 2)}
    d: list[float] = []
    with timing_history(target, K_MAX + 1) as tt, timing_history(draft, 1) as dt:
        for rep in range(rounds + 1):
            for n in range(1, K_MAX + 2):
                seconds = timed_pass(target, tt[:n], False, None)
                one = timed_pass(draft, dt[:1], False, None)
                if rep:  # the first round allocates graphs
                    t[n].append(seconds)
                    d.append(one)
    return {n: low_quantile(s) for n, s in t.items()}, low_quantile(d)


def candidates(n: int) -> list[Subset]:
    """Interior spans of a quarter, three eighths and half of the blocks, early, centred and late; every other
    interior block; and early exit at half (the first half kept) for reference."""
    found: dict[tuple[int, ...], Subset] = {}
    for m in sorted({max(1, n // 4), max(1, 3 * n // 8), max(1, n // 2)}):
        for start in sorted({1, 1 + (n - 2 - m) // 2, n - 1 - m}):
            skipped = tuple(range(start, start + m))
            found[skipped] = Subset(n, skipped)
    found[tuple(range(1, n - 1, 2))] = Subset(n, tuple(range(1, n - 1, 2)))
    found[tuple(range(n // 2, n))] = Subset(n, tuple(range(n // 2, n)))
    return list(found.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target (a models.toml name or a path); default: the embedded Gemma 3 270M")
    ap.add_argument("--suite", default="default", help="a shipped suite's name or a JSONL file")
    ap.add_argument("--prompts", type=int, default=4, help="how many of the suite's prompts")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--subsets", help="';'-separated --skip-layers values (default: a grid, see candidates())")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved timing rounds per subset")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    name, path = resolve(args.model)
    suite = load_suite(Path(args.suite))
    # the target scores at most K_MAX + 1 rows a pass, as a verifying runtime's does (a context sized for n_batch
    # outputs ran some timed passes ~100x slower here); the draft scores a whole text at once
    with Model(path) as model, Context(model, n_ctx=2048, n_threads=args.threads, greedy_rows=K_MAX + 1) as target:
        prompts = [model.vocab.tokenize(p.prompt) for p in suite.prompts[: args.prompts]]
        texts = greedy_texts(target, prompts, args.max_tokens)
        n = model.n_layer
        subsets = ([Subset.parse(s, n) for s in args.subsets.split(";")] if args.subsets else candidates(n))
        print(f"{name}, {n} blocks: {len(prompts)} prompts of {suite.name}, {sum(map(len, texts))} target tokens; "
              f"{args.threads} thread(s)\n")
        print("| blocks skipped | kept | top-1 agreement | tokens a step, k=1 / 2 / 4 | draft pass ÷ target pass "
              "| expected speed ÷ target-only (best k) | target pass of 1 / 2 / 5 rows, ms |")
        print("|---|---|---|---|---|---|---|", flush=True)
        for subset in subsets:
            with (Model(layer_skip_model(path, subset)) as m,
                  Context(m, n_ctx=2048, n_threads=args.threads, greedy_rows=args.max_tokens) as d):
                agrees = agreement(d, prompts, texts)
                t, one = time_passes(target, d, args.rounds)
            steps = {k: tokens_a_step(agrees, k) for k in range(1, K_MAX + 1)}
            speed = {k: steps[k] * t[1] / (k * one + t[k + 1]) for k in steps}
            r = Row(subset.slug, len(subset.kept), statistics.fmean(sum(agrees, [])), steps, one / t[1], speed)
            k, best = r.best()
            print(f"| {r.subset} | {r.kept} of {n} | {r.agreement:.0%} | {steps[1]:.2f} / {steps[2]:.2f} / "
                  f"{steps[4]:.2f} | {r.cost_ratio:.2f} | {best:.2f}x (k={k}) | {t[1] * 1000:.0f} / "
                  f"{t[2] * 1000:.0f} / {t[5] * 1000:.0f} |", flush=True)

if __name__ == "__main__":
    main()
