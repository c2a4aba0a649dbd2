#!/usr/bin/env python3
"""A bounded load test for OpenAI-compatible servers: N clients, each holding an M-turn conversation (every turn
resends the whole conversation with the answer and a new message, as agents do), streamed and greedy, against
`localspec serve` and llama-cpp-python's own server (as installed; queued instead of cancelling; and with its
prompt-lookup decoding) on the same model, one server at a time so they never share the CPU.

It reports, per server: p50 and p95 time to first token, total tokens per second over the run's wall time, errors,
answers lost (no text) or mixed (two clients that sent the same conversation got unrelated texts: greedy answers
to the same request agree, up to a numerical near-tie late in the text), and where the server says so, the prompt
tokens its cache held and the draft tokens it had accepted.

    .venv/bin/pip install -e '.[loadtest]'    # llama-cpp-python's server's own dependencies (not its rebuild)
    .venv/bin/python scripts/serve_load.py                       # 8 clients x 2 turns, all three servers
    .venv/bin/python scripts/serve_load.py --clients 1 --requests 4 --servers localspec
    .venv/bin/python scripts/serve_load.py --base-url http://127.0.0.1:8000/v1   # a server already running
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT.parent / "shared" / "bench" / "prompts.jsonl"
FOLLOW_UPS = ["Now say it again, shorter.", "Good. Now list the three most important facts from it.",
              "Repeat your last answer exactly.", "Thanks. One more time, word for word."]


@dataclass
class Outcome:
    client: int
    turn: int
    conversation: int
    ttft: float | None = None
    seconds: float = 0.0
    tokens: int = 0
    text: str = ""
    error: str = ""
    cached: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class Report:
    server: str
    clients: int
    requests: int
    wall: float = 0.0
    tokens: int = 0
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    errors: int = 0
    lost: int = 0
    mixed: int = 0
    prompt_tokens_cached: int = 0
    drafted: int = 0
    accepted: int = 0
    note: str = ""
    samples: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0


def prompts() -> list[str]:
    path = SUITE if SUITE.exists() else ROOT / "localspec" / "bench_suites" / "default.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["prompt"] for r in rows]


async def client(base_url: str, key: str, index: int, turns: int, first: str, conversation: int, max_tokens: int,
                 model: str) -> list[Outcome]:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    messages = [{"role": "user", "content": first}]
    out: list[Outcome] = []
    for turn in range(turns):
        o = Outcome(index, turn, conversation)
        start = time.perf_counter()
        pieces: list[str] = []
        chunks = 0
        try:
            stream = await api.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True})
            async for chunk in stream:
                extra = chunk.model_extra or {}
                if chunk.choices and chunk.choices[0].delta.content:
                    if o.ttft is None:
                        o.ttft = time.perf_counter() - start
                    pieces.append(chunk.choices[0].delta.content)
                    chunks += 1
                if chunk.usage is not None:
                    o.tokens = chunk.usage.completion_tokens
                    details = chunk.usage.prompt_tokens_details
                    o.cached = (details.cached_tokens or 0) if details is not None else 0
                if extra.get("timings"):
                    o.drafted = extra["timings"].get("draft_n", 0)
                    o.accepted = extra["timings"].get("draft_n_accepted", 0)
        except Exception as e:  # a load test reports failures, it does not stop at the first
            o.error = f"{type(e).__name__}: {str(e)[:160]}"
        o.seconds = time.perf_counter() - start
        o.text = "".join(pieces)
        o.tokens = o.tokens or chunks  # no usage: one token a chunk (llama-cpp-python streams token by token)
        out.append(o)
        if o.error:
            break
        messages += [{"role": "assistant", "content": o.text}, {"role": "user", "content": FOLLOW_UPS[turn % 4]}]
    await api.close()
    return out


def _agree(a: str, b: str) -> bool:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a == b or n >= min(len(a), len(b), 12)


async def load(base_url: str, key: str, clients: int, turns: int, max_tokens: int, model: str, name: str) -> Report:
    texts = prompts()
    # two clients share each conversation: greedy answers to the same request must agree
    distinct = max(1, clients // 2)
    start = time.perf_counter()
    results = await asyncio.gather(*(client(base_url, key, i, turns, texts[i % distinct % len(texts)],
                                            i % distinct, max_tokens, model) for i in range(clients)))
    report = Report(name, clients, clients * turns, wall=time.perf_counter() - start)
    outcomes = [o for r in results for o in r]
    report.errors = sum(bool(o.error) for o in outcomes) + clients * turns - len(outcomes)
    report.lost = sum(not o.error and not o.text for o in outcomes)
    report.tokens = sum(o.tokens for o in outcomes if not o.error)
    ttfts = sorted(o.ttft for o in outcomes if o.ttft is not None)
    if ttfts:
        report.ttft_p50 = statistics.median(ttfts)
        report.ttft_p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
    by_request: dict[tuple[int, int], list[Outcome]] = {}
    for o in outcomes:
        if not o.error:
            by_request.setdefault((o.conversation, o.turn), []).append(o)
    report.mixed = sum(1 for group in by_request.values() for o in group[1:] if not _agree(o.text, group[0].text))
    report.prompt_tokens_cached = sum(o.cached for o in outcomes)
    report.drafted = sum(o.drafted for o in outcomes)
    report.accepted = sum(o.accepted for o in outcomes)
    report.samples = sorted({o.error for o in outcomes if o.error})[:3]
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path() -> str:
    from localspec.models.embedded import ensure_default_model

    return str(ensure_default_model(progress=False))


def command(server: str, port: int, args: argparse.Namespace) -> list[str]:
    threads = str(args.threads or os.cpu_count() or 2)
    if server == "localspec":
        return [sys.executable, "-m", "localspec", "serve", "--port", str(port), "--parallel", args.parallel,
                "--threads", threads, "--ctx", str(args.ctx), "--queue-timeout", "600"]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model_path(), "--port", str(port), "--host",
           "127.0.0.1", "--n_ctx", str(args.ctx), "--n_threads", threads, "--n_threads_batch", threads]
    if server != "llama-cpp":  # its default cancels a running stream when another request comes in
        cmd += ["--interrupt_requests", "False"]
    if server == "llama-cpp-lookup":
        cmd += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10"]
    return cmd


async def ready(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            await api.models.list()
            await api.close()
            return
        except Exception:
            await asyncio.sleep(0.5)
    raise RuntimeError("not ready in time")


def run_server(server: str, args: argparse.Namespace) -> Report:
    port = free_port()
    log = Path(f"/tmp/serve_load-{server}.log")
    with log.open("wb") as err:
        proc = subprocess.Popen(command(server, port, args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            try:
                asyncio.run(ready(base, proc))
            except RuntimeError as e:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                return Report(server, args.clients, args.clients * args.requests, note=f"did not start ({e}): "
                              + " | ".join(tail))
            # one request first: model warm-up and localspec's calibration are not what is measured
            asyncio.run(load(base, "x", 1, 1, 8, "default" if server == "localspec" else model_path(), "warm"))
            model = "default" if server == "localspec" else model_path()
            return asyncio.run(load(base, "x", args.clients, args.requests, args.max_tokens, model, server))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def table(reports: list[Report]) -> str:
    rows = ["| server | requests | tok/s | TTFT p50 s | TTFT p95 s | errors | lost | mixed | cached prompt tokens | "
            "accepted / drafted |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        def s(x: float | None) -> str:
            return "–" if x is None else f"{x:.2f}"

        drafts = f"{r.accepted} / {r.drafted}" if r.drafted else "–"
        rows.append(f"| {r.server} | {r.requests} | {r.tokens_per_second:.1f} | {s(r.ttft_p50)} | {s(r.ttft_p95)} | "
                    f"{r.errors} | {r.lost} | {r.mixed} | {r.prompt_tokens_cached or '–'} | {drafts} |"
                    + (f" {r.note}" if r.note else ""))
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="localspec,llama-cpp,llama-cpp-queued,llama-cpp-lookup",
                    help="llama-cpp: its server as installed (a new request cancels a running stream); -queued: "
                    "with --interrupt_requests False (one at a time, none cancelled); -lookup: that, with its "
                    "prompt-lookup decoding")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="turns of each client's conversation")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parallel", default="auto", help="localspec serve --parallel")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--base-url", help="load a server that is already running instead")
    ap.add_argument("--api-key", default=os.environ.get("LOCALSPEC_API_KEY", "x"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.base_url:
        reports = [asyncio.run(load(args.base_url, args.api_key, args.clients, args.requests, args.max_tokens,
                                    "default", re.sub(r"^https?://", "", args.base_url)))]
    else:
        reports = []
        for server in args.servers.split(","):
            print(f"{server}: {args.clients} clients x {args.requests} turns ...", file=sys.stderr, flush=True)
            reports.append(run_server(server, args))
    if args.json:
        print(json.dumps([{**asdict(r), "tokens_per_second": r.tokens_per_second} for r in reports], indent=1))
    else:
        print(table(reports))
        for r in reports:
            for sample in r.samples:
                print(f"  {r.server}: {sample}")


if __name__ == "__main__":
    main()
