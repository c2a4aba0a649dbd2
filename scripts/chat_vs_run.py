#!/usr/bin/env python3
"""Does the chat UI slow decoding down? tok/s of an answer in the real ChatApp (headless, driven by Textual's
Pilot) against the same generation without a UI (what `localspec run --chat` does), alternating, medians.

    .venv/bin/python scripts/chat_vs_run.py [--rounds 3] [--max-tokens 256] [--drafter none]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from localspec.cli.options import Options, build_options
from localspec.engine import Message
from localspec.events import Finished
from localspec.runtime import Runtime
from localspec.tui.app import ChatApp

PROMPT = "Write a Python function that checks whether a number is prime, then explain it."


def options(drafter: str, max_tokens: int) -> Options:
    return build_options(
        model=None, profile=None, drafter=drafter, draft=None, k=None, exit_layer=None, p_min=0.0,
        max_tokens=max_tokens, temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, seed=0, stop=None, ctx=4096,
        threads=None, gpu_layers=0, verbose=False,
    )  # fmt: skip


def without_ui(opts: Options) -> float:
    with Runtime.open(opts.model, opts.runtime, opts.speculation, opts.sampling) as rt:
        tokens = rt.model.vocab.tokenize(rt.chat_template.apply([Message("user", PROMPT)]))
        done = [e for e in rt.generator.generate(tokens, opts.generation) if isinstance(e, Finished)][0]
        return done.stats.tokens_per_second


async def in_chat(opts: Options) -> float:
    app = ChatApp(opts)
    async with app.run_test(size=(110, 36)) as pilot:
        while not app.ready:
            await pilot.pause(0.05)
        await pilot.press(*PROMPT)
        await pilot.press("enter")
        deadline = time.monotonic() + 300
        while (app.last_finished is None or app.busy) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert app.last_finished is not None
        return app.last_finished.stats.tokens_per_second


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--drafter", default="none")
    args = ap.parse_args()
    opts = options(args.drafter, args.max_tokens)
    run_tps, chat_tps = [], []
    for _ in range(args.rounds):
        run_tps.append(without_ui(opts))
        chat_tps.append(asyncio.run(in_chat(opts)))
    r, c = statistics.median(run_tps), statistics.median(chat_tps)
    print(f"run  {r:.1f} tok/s  ({', '.join(f'{v:.1f}' for v in run_tps)})")
    print(f"chat {c:.1f} tok/s  ({', '.join(f'{v:.1f}' for v in chat_tps)})  = {c / r:.1%} of run")


if __name__ == "__main__":
    main()
