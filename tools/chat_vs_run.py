#!/usr/bin/env python3
"""Does the chat UI slow decoding down? tok/s of an answer in the real ChatApp (headless, driven by Textual's
Pilot) against the same generation without a UI (what `localspec run --chat` does), alternating, medians.
Each measurement runs in a fresh process, as a user's `localspec run` or `localspec chat` would: llama.cpp's
OpenMP threads belong to the thread that first decoded, and two sets of them in one process slow each other down.
The history is off: each round asks the same prompt, which would otherwise draft from the rounds before it (and
write into the user's history on disk).

    .venv/bin/python tools/chat_vs_run.py [--rounds 3] [--max-tokens 256] [--drafter none]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from dataclasses import replace

from localspec.cli.options import build_options
from localspec.engine import Message
from localspec.events import Finished
from localspec.runtime import Runtime
from localspec.settings import HistorySettings, Settings
from localspec.tui.app import ChatApp

PROMPT = "Write a Python function that checks whether a number is prime, then explain it."


def options(drafter: str, max_tokens: int) -> Settings:
    opts = build_options(drafter=drafter, max_tokens=max_tokens, seed=0, gpu_layers=0)
    return replace(opts, history=HistorySettings("off"))


def without_ui(opts: Settings) -> float:
    with Runtime.open(opts) as rt:
        tokens = rt.model.vocab.tokenize(rt.chat_template.apply([Message("user", PROMPT)]))
        done = [e for e in rt.generate(tokens, opts.generation) if isinstance(e, Finished)][0]
        return done.stats.tokens_per_second


async def in_chat(opts: Settings) -> float:
    app = ChatApp(opts)
    async with app.run_test(size=(110, 36)) as pilot:
        while not app.ready:
            await pilot.pause(0.05)
        await pilot.press(*PROMPT)
        await pilot.press("enter")
        deadline = time.monotonic() + 300
        while (app.last_finished is None or app.busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)  # poll gently: the harness must not be what slows the app down
        assert app.last_finished is not None
        return app.last_finished.stats.tokens_per_second


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--drafter", default="none")
    ap.add_argument("--phase", choices=("run", "chat"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    opts = options(args.drafter, args.max_tokens)
    if args.phase:
        print(without_ui(opts) if args.phase == "run" else asyncio.run(in_chat(opts)))
        return

    def measure(phase: str) -> float:
        cmd = [sys.executable, __file__, "--phase", phase, "--max-tokens", str(args.max_tokens), "--drafter",
               args.drafter]
        return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])

    run_tps, chat_tps = [], []
    for _ in range(args.rounds):
        run_tps.append(measure("run"))
        chat_tps.append(measure("chat"))
    r, c = statistics.median(run_tps), statistics.median(chat_tps)
    print(f"run  {r:.1f} tok/s  ({', '.join(f'{v:.1f}' for v in run_tps)})")
    print(f"chat {c:.1f} tok/s  ({', '.join(f'{v:.1f}' for v in chat_tps)})  = {c / r:.1%} of run")


if __name__ == "__main__":
    main()
