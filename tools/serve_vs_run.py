#!/usr/bin/env python3
"""One client against `localspec run` (issue #17's goal: within 5%): every prompt of the public suite as a chat,
greedy, drafter auto, through `localspec run --chat --json` and through one streamed request at a time to
`localspec serve`, alternating, --rounds times. Decode tokens per second as each reports it (run's stats, the
server's timings.predicted_per_second), medians per prompt, and their ratio; the texts must be equal. Both run with
the history off (LOCALSPEC_HISTORY=off): a round would otherwise draft from the answers of the rounds before it,
and run and serve would each measure their own history, not their decoding.

    .venv/bin/python tools/serve_vs_run.py [--rounds 2] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT.parent / "shared" / "bench" / "prompts.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    rows = [json.loads(line) for line in SUITE.read_text(encoding="utf-8").splitlines() if line.strip()]
    env = {**os.environ, "LOCALSPEC_HISTORY": "off"}  # no prompt drafts from its own earlier rounds
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", "0", "--parallel", "auto"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    port = 0
    for line in proc.stderr:
        if m := re.search(r"127\.0\.0\.1:(\d+)/v1", line):
            port = int(m.group(1))
            break
    api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600)
    ratios, same = [], 0
    try:
        print("| prompt | run tok/s | serve tok/s | serve / run | same text |\n|---|---|---|---|---|")
        for row in rows:
            runs, served, texts = [], [], set()
            for _ in range(args.rounds):
                out = subprocess.run([sys.executable, "-m", "localspec", "run", row["prompt"], "--chat", "-n",
                                      str(args.max_tokens), "--json"], cwd=ROOT, env=env, capture_output=True,
                                     text=True)
                doc = json.loads(out.stdout)
                runs.append(doc["stats"]["tokens_per_second"])
                texts.add(doc["text"])
                pieces, timings = [], {}
                for chunk in api.chat.completions.create(model="default", stream=True, max_tokens=args.max_tokens,
                                                         messages=[{"role": "user", "content": row["prompt"]}]):
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
                    timings = (chunk.model_extra or {}).get("timings") or timings
                served.append(timings["predicted_per_second"])
                texts.add("".join(pieces))
            r, s = statistics.median(runs), statistics.median(served)
            ratios.append(s / r)
            same += len(texts) == 1
            print(f"| {row['id']} | {r:.1f} | {s:.1f} | {s / r:.3f} | {'yes' if len(texts) == 1 else 'no'} |",
                  flush=True)
        print(f"\nmedian serve / run: {statistics.median(ratios):.3f} · geometric mean "
              f"{statistics.geometric_mean(ratios):.3f} · same text {same}/{len(rows)}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
