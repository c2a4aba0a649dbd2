#!/usr/bin/env python3
"""A bounded load test for OpenAI-compatible servers: N clients, each holding an M-turn conversation (every turn
resends the whole conversation with the answer and a new message, as agents do), streamed and greedy, against
`localspec serve`, llama.cpp's own `llama-server` (plain, and with its n-gram speculation) and llama-cpp-python's
server (as installed; queued instead of cancelling; and with its prompt-lookup decoding) on the same model, one
server at a time so they never share the CPU. Every server gets the same threads, the same number of parallel
sequences and the same context per sequence (llama-cpp-python's server has one sequence: it queues).

It reports, per server and number of clients: p50 and p95 time to first token, total tokens per second over the
run's wall time, errors, answers lost (no text) or mixed (two clients that sent the same conversation got unrelated
texts: greedy answers to the same request agree, up to a numerical near-tie late in the text), and where the server
says so, the prompt tokens its cache held and the draft tokens it had accepted. The clients are created, imported
and warmed (one request, and a connection each) in this process before the clock starts.

    scripts/setup --anchors                   # builds llama-server (and llama-bench) into .venv/bin
    .venv/bin/pip install -e '.[loadtest]'    # llama-cpp-python's server's own dependencies (not its rebuild)
    .venv/bin/python tools/serve_load.py                       # 1, 8 and 32 clients x 2 turns, four servers
    .venv/bin/python tools/serve_load.py --clients 1 --requests 4 --servers localspec
    .venv/bin/python tools/serve_load.py --base-url http://127.0.0.1:8000/v1   # a server already running
    .venv/bin/python tools/serve_load.py --suite extract-json --items --schemas   # structured output, each server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# here, not in the clients: an import inside the timed region cost the first client a second (issue #27)
from openai import AsyncOpenAI

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
    cache_accepted: int = 0  # of the accepted, drafted from earlier requests (localspec's history)
    passes: int = 0  # the target passes the request's sequence took part in, where the server says


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
    cache_accepted: int = 0
    passes: int = 0
    note: str = ""
    samples: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0


def prompts(suite: str | None = None) -> list[str]:
    """The measured prompts: ``suite`` (a shipped suite's name, e.g. template-emails, or a JSONL file), else the
    public suite beside the checkout, else the built-in one."""
    shipped = ROOT / "localspec" / "bench_suites"
    if suite:
        path = Path(suite) if Path(suite).is_file() else shipped / f"{suite}.jsonl"
    else:
        path = SUITE if SUITE.exists() else shipped / "default.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:  # a row's JSON schema (structured suites): sent as its response_format with --schemas
        if "schema" in r:
            SCHEMAS[r["prompt"]] = {"type": "json_schema", "json_schema": {"name": r["id"], "schema": r["schema"]}}
    return [r["prompt"] for r in rows]


SCHEMAS: dict[str, dict] = {}  # prompt → its response_format (--schemas)
USE_SCHEMAS = False


def _tool(name: str, description: str, **properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}}}


_TEXT = {"type": "string"}
# the tools the shipped tool-calls suite's prompts describe, as OpenAI tools (--tools)
TOOLS = [
    _tool("get_weather", "The weather in a city.", city=_TEXT, unit={"enum": ["c", "f"]}),
    _tool("search_flights", "Flights between two cities on a date.", origin=_TEXT, destination=_TEXT, date=_TEXT),
    _tool("add_calendar_event", "A calendar event.", title=_TEXT, date=_TEXT, time=_TEXT),
    _tool("send_email", "An email.", to=_TEXT, subject=_TEXT, body=_TEXT),
]
TOOL_CHOICE: str | None = None  # --tools: "auto" or "required", sent with TOOLS in every request


SERVERS = {
    "localspec": "localspec serve (drafter auto)",
    "localspec-no-history": "localspec serve drafting from no earlier request (LOCALSPEC_HISTORY=off)",
    "localspec-plain": "localspec serve drafting nothing (--drafter none): plain batching, what drafts are measured "
                       "against (docs/performance.md, the ceiling of drafts in a batch)",
    "localspec@DIR": "localspec serve as another checkout's package in DIR has it (git archive COMMIT localspec | "
                     "tar -x -C DIR); also localspec-no-history@DIR",
    "llama-server": "llama.cpp's llama-server in its fastest greedy configuration (greedy sampling in its graph)",
    "llama-server-ngram": "llama-server with its n-gram speculation (--ngram-args), same configuration",
    "llama-server-draft": "llama-server with the --profile's draft model (-md, --draft-args), same configuration",
    "llama-server-defaults": "llama-server with its default sampler chain",
    "llama-server-ngram-defaults": "llama-server's n-gram with its default sampler chain (at 1 client it beat the "
                                   "fast configuration on an H200, 845 against 730 tok/s)",
    "llama-cpp": "llama-cpp-python's server as installed (a new request cancels a running stream)",
    "llama-cpp-queued": "llama-cpp-python's server, --interrupt_requests False (one request at a time)",
    "llama-cpp-lookup": "llama-cpp-python's server, queued, with its prompt-lookup decoding",
}
# the load is greedy (temperature 0), and llama-server is fastest at it with the sampling in its graph and no chain
# after it: on an H200 (2026-11-26) 2278 tok/s at 8 clients against 952 with its default chain; an anchor is an
# honest comparison only at its best
FAST_GREEDY = ["--backend-sampling", "--samplers", "top_k", "--top-k", "1"]
WARM_PROMPT = "Say hello in five words."  # not one of the measured prompts: the warm-up fills no cache they use


def api_client(base_url: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)


async def client(api: AsyncOpenAI, index: int, turns: int, first: str, conversation: int, max_tokens: int,
                 model: str, then: list[str] | None = None) -> list[Outcome]:
    """A conversation of ``turns`` turns, or with ``then`` one new single-message request a turn (a job's items)."""
    messages = [{"role": "user", "content": first}]
    out: list[Outcome] = []
    for turn in range(turns):
        o = Outcome(index, turn, conversation)
        start = time.perf_counter()
        pieces: list[str] = []
        chunks = 0
        try:
            shaped = SCHEMAS.get(messages[-1]["content"]) if USE_SCHEMAS else None
            tools = {"tools": TOOLS, "tool_choice": TOOL_CHOICE} if TOOL_CHOICE else {}
            stream = await api.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True},
                                                       **({"response_format": shaped} if shaped else {}), **tools)
            async for chunk in stream:
                extra = chunk.model_extra or {}
                delta = chunk.choices[0].delta if chunk.choices else None
                # a call's name and arguments stream as tool_calls deltas: the answer's text for the comparison
                said = (delta.content or "") + "".join(
                    (c.function.name or "") + (c.function.arguments or "")
                    for c in (delta.tool_calls or []) if c.function is not None) if delta is not None else ""
                if said:
                    if o.ttft is None:
                        o.ttft = time.perf_counter() - start
                    pieces.append(said)
                    chunks += 1
                if chunk.usage is not None:
                    o.tokens = chunk.usage.completion_tokens
                    details = chunk.usage.prompt_tokens_details
                    o.cached = (details.cached_tokens or 0) if details is not None else 0
                if extra.get("timings"):
                    o.drafted = extra["timings"].get("draft_n", 0)
                    o.accepted = extra["timings"].get("draft_n_accepted", 0)
                    o.cache_accepted = extra["timings"].get("draft_n_cache_accepted", 0)
                    o.passes = extra["timings"].get("target_passes", 0)
        except Exception as e:  # a load test reports failures, it does not stop at the first
            o.error = f"{type(e).__name__}: {str(e)[:160]}"
        o.seconds = time.perf_counter() - start
        o.text = "".join(pieces)
        o.tokens = o.tokens or chunks  # no usage: one token a chunk (llama-cpp-python streams token by token)
        out.append(o)
        if o.error:
            break
        if then is not None:
            messages = [{"role": "user", "content": then[(turn + 1) % len(then)]}]
        else:
            messages += [{"role": "assistant", "content": o.text}, {"role": "user", "content": FOLLOW_UPS[turn % 4]}]
    return out


async def warm(apis: list[AsyncOpenAI], model: str) -> None:
    """One streamed request through the same code path the clients take (the server's warm-up, localspec's first
    calibration, the client library's first use), then a connection for every client."""
    stream = await apis[0].chat.completions.create(model=model, messages=[{"role": "user", "content": WARM_PROMPT}],
                                                   max_tokens=8, temperature=0, stream=True,
                                                   stream_options={"include_usage": True})
    async for _ in stream:
        pass
    # best effort: llama-server refused some of 32 connections opened at once here (its HTTP threads); a client that
    # got none opens its own in the run, as any client would
    await asyncio.gather(*(api.models.list() for api in apis), return_exceptions=True)


def _agree(a: str, b: str) -> bool:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a == b or n >= min(len(a), len(b), 12)


async def load(base_url: str, key: str, clients: int, turns: int, max_tokens: int, model: str, name: str,
               suite: str | None = None, items: bool = False, warm_turns: int = 0) -> Report:
    texts = prompts(suite)
    # two clients share each conversation: greedy answers to the same request must agree
    distinct = max(1, clients // 2)
    apis = [api_client(base_url, key) for _ in range(clients)]
    # with items, each client its own items of the job, one request each: client i takes items i, i + clients, ...
    mine = [texts[i::clients] or [texts[i % len(texts)]] for i in range(clients)]
    try:
        await warm(apis, model)
        if items and warm_turns:  # the job's first items, untimed: what a server that has been up holds already
            await asyncio.gather(*(client(apis[i], i, warm_turns, mine[i][0], i, max_tokens, model, mine[i])
                                   for i in range(clients)))
            mine = [m[warm_turns:] or m for m in mine]
        start = time.perf_counter()
        if items:
            results = await asyncio.gather(*(client(apis[i], i, turns, mine[i][0], i, max_tokens, model, mine[i])
                                             for i in range(clients)))
        else:
            results = await asyncio.gather(*(client(apis[i], i, turns, texts[i % distinct % len(texts)],
                                                    i % distinct, max_tokens, model) for i in range(clients)))
        wall = time.perf_counter() - start
    finally:
        await asyncio.gather(*(api.close() for api in apis))
    report = Report(name, clients, clients * turns, wall=wall)
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
    report.cache_accepted = sum(o.cache_accepted for o in outcomes)
    report.passes = sum(o.passes for o in outcomes)
    report.samples = sorted({o.error for o in outcomes if o.error})[:3]
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROFILE: str | None = None  # --profile: a target/draft pair from models.toml instead of the embedded model


def model_path() -> str:
    if PROFILE is not None:
        return str(profile_paths()[0])
    from localspec.models.embedded import ensure_default_model

    return str(ensure_default_model(progress=False))


def profile_paths() -> tuple[Path, Path | None]:
    """The --profile's target and draft files (pulled first: `localspec pull PROFILE`)."""
    from localspec.models.registry import resolve_profile
    from localspec.models.sources import resolve_model

    assert PROFILE is not None
    p = resolve_profile(PROFILE)
    return resolve_model(p.target).path, resolve_model(p.draft).path if p.draft else None


def llama_server_binary(args: argparse.Namespace) -> str | None:
    """llama-server as scripts/setup --anchors builds it (beside this interpreter), else from PATH."""
    if args.llama_server:
        return args.llama_server if Path(args.llama_server).is_file() else None
    beside = Path(sys.executable).parent / "llama-server"
    return str(beside) if beside.exists() else shutil.which("llama-server")


def command(server: str, port: int, args: argparse.Namespace, model: str) -> list[str]:
    """How each server is started: the same threads, parallel sequences and context per sequence for all."""
    threads = str(args.threads or os.cpu_count() or 2)
    name, _, code = server.partition("@")
    if name in ("localspec", "localspec-no-history", "localspec-plain"):
        env = ["LOCALSPEC_HISTORY=off"] if name == "localspec-no-history" else []
        # another checkout's package (git archive COMMIT localspec | tar -x -C DIR): before/after in one run. It runs
        # in DIR (run_server): `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH
        if code and not (Path(code) / "localspec" / "__init__.py").is_file():
            raise FileNotFoundError(f"{server}: {code} holds no localspec package")
        return [*(["env", *env] if env else []), sys.executable, "-m", "localspec", "serve", "--port", str(port),
                "--parallel", str(args.parallel), "--threads", threads, "--ctx", str(args.ctx), "--queue-timeout",
                "600", *(["--drafter", "none"] if name == "localspec-plain" else []),
                *(["--profile", PROFILE] if PROFILE is not None else [])]
    if server.startswith("llama-server") and server in SERVERS:
        binary = llama_server_binary(args)
        if binary is None:
            raise FileNotFoundError("no llama-server: run scripts/setup --anchors (or pass --llama-server PATH)")
        # -c is the whole KV cache, split evenly between the -np slots (not unified when -np is given). The model
        # carries no chat template: llama.cpp's built-in gemma one, as localspec falls back to for this architecture
        # (--no-jinja: with Jinja on, "gemma" is taken for a template text, and every prompt becomes that word).
        # a --profile's model carries its own template (Jinja, as localspec renders it)
        template = ["--jinja"] if PROFILE is not None else ["--no-jinja", "--chat-template", "gemma"]
        cmd = [binary, "--model", model, "--host", "127.0.0.1", "--port", str(port), "--threads", threads,
               "--threads-batch", threads, "--parallel", str(args.parallel), "--ctx-size",
               str(args.ctx * args.parallel), *template, "--no-webui"]
        cmd += [] if server.endswith("-defaults") else FAST_GREEDY
        if server.startswith("llama-server-draft"):
            draft = profile_paths()[1] if PROFILE is not None else None
            if draft is None:
                raise FileNotFoundError(f"{server} needs a --profile with a draft model")
            return cmd + ["--model-draft", str(draft), "--threads-draft", threads, "--threads-batch-draft", threads,
                          *shlex.split(args.draft_args)]
        return cmd + (shlex.split(args.ngram_args) if server.startswith("llama-server-ngram") else [])
    if server not in SERVERS:
        raise ValueError(f"unknown server {server!r}: known are {', '.join(SERVERS)}")
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--host",
           "127.0.0.1", "--n_ctx", str(args.ctx), "--n_threads", threads, "--n_threads_batch", threads]
    if server != "llama-cpp":  # its default cancels a running stream when another request comes in
        cmd += ["--interrupt_requests", "False"]
    if server == "llama-cpp-lookup":
        cmd += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10"]
    return cmd


def workdir(server: str) -> Path:
    """Where ``server`` runs: DIR for localspec@DIR (``python -m`` imports from its working folder first, ahead of
    PYTHONPATH), else this checkout."""
    code = server.partition("@")[2]
    return Path(code).resolve() if code else ROOT


async def ready(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
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


def run_server(server: str, clients: int, args: argparse.Namespace) -> Report:
    """Start ``server`` afresh (no cache from another run), load it with ``clients`` clients, stop it."""
    port = free_port()
    log = Path(f"/tmp/serve_load-{re.sub(r'[^A-Za-z0-9_.-]', '_', server)}-{clients}.log")
    try:
        cmd = command(server, port, args, model_path())
    except (FileNotFoundError, ValueError) as e:
        return Report(server, clients, clients * args.requests, note=str(e))
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=workdir(server), stdout=subprocess.DEVNULL, stderr=err)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            try:
                asyncio.run(ready(base, proc))
            except RuntimeError as e:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                return Report(server, clients, clients * args.requests, note=f"did not start ({e}): "
                              + " | ".join(tail))
            model = "default" if server.startswith("localspec") else model_path()
            try:
                return asyncio.run(load(base, "x", clients, args.requests, args.max_tokens, model, server, args.suite,
                                        args.items, args.warm_turns))
            except Exception as e:  # the warm-up failed: say so in the table, and go on with the other servers
                return Report(server, clients, clients * args.requests, note=f"failed: {type(e).__name__}: {e}")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def table(reports: list[Report]) -> str:
    rows = ["| server | clients | requests | tok/s | TTFT p50 s | TTFT p95 s | errors | lost | mixed | "
            "cached prompt tokens | accepted / drafted | of them from earlier requests | tokens a pass |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        def s(x: float | None) -> str:
            return "–" if x is None else f"{x:.2f}"

        drafts = f"{r.accepted} / {r.drafted}" if r.drafted else "–"
        rows.append(f"| {r.server} | {r.clients} | {r.requests} | {r.tokens_per_second:.1f} | {s(r.ttft_p50)} | "
                    f"{s(r.ttft_p95)} | {r.errors} | {r.lost} | {r.mixed} | {r.prompt_tokens_cached or '–'} | "
                    f"{drafts} | {r.cache_accepted or '–'} | {s(r.tokens / r.passes) if r.passes else '–'} |"
                    + (f" {r.note}" if r.note else ""))
    return "\n".join(rows)


def against_llama_server(reports: list[Report]) -> list[str]:
    """localspec against llama-server's best configuration, per number of clients: tok/s and p95 TTFT ratios."""
    lines = []
    for clients in sorted({r.clients for r in reports}):
        ours = next((r for r in reports if r.clients == clients and r.server == "localspec" and not r.note), None)
        theirs = [r for r in reports if r.clients == clients and r.server.startswith("llama-server") and not r.note
                  and r.tokens_per_second > 0]
        if ours is None or not theirs:
            continue
        best = max(theirs, key=lambda r: r.tokens_per_second)
        ttft = (f"p95 TTFT {ours.ttft_p95:.2f} s vs {best.ttft_p95:.2f} s"
                if ours.ttft_p95 is not None and best.ttft_p95 is not None else "p95 TTFT –")
        lines.append(f"{clients} clients: localspec {ours.tokens_per_second / best.tokens_per_second:.2f}x "
                     f"{best.server} (its best here), {ttft}")
    return lines


def client_counts(text: str) -> list[int]:
    counts = [int(c) for c in text.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--clients wants positive numbers, comma-separated: {text!r}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="localspec,llama-server,llama-server-ngram,llama-server-ngram-defaults,"
                    "llama-cpp-lookup",
                    help="comma-separated: " + "; ".join(f"{k}: {v}" for k, v in SERVERS.items()))
    ap.add_argument("--clients", type=client_counts, default=[1, 8, 32], help="numbers of clients, comma-separated")
    ap.add_argument("--requests", type=int, default=2, help="turns of each client's conversation")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=8, help="sequences decoded together, for every server")
    ap.add_argument("--ctx", type=int, default=4096, help="context per sequence, for every server")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--llama-server", help="the llama-server binary (default: .venv/bin/llama-server)")
    ap.add_argument("--ngram-args", default="--spec-type ngram-mod",
                    help="llama-server-ngram's speculation flags (default: its n-gram-mod drafts, as shipped)")
    ap.add_argument("--draft-args", default="--spec-type draft-simple --spec-draft-n-max 3",
                    help="llama-server-draft's speculation flags (default: draft-simple, 3 tokens)")
    ap.add_argument("--profile", help="a target/draft pair from models.toml (e.g. qwen2.5-coder-1.5b) for every "
                    "server: localspec serve --profile, llama-server --model TARGET (--model-draft DRAFT for "
                    "llama-server-draft)")
    ap.add_argument("--base-url", help="load a server that is already running instead")
    ap.add_argument("--api-key", default=os.environ.get("LOCALSPEC_API_KEY", "x"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--suite", help="the prompts: a shipped suite's name (template-emails, tool-calls, ...) or a "
                    "JSONL file (default: ../shared/bench/prompts.jsonl, else the built-in suite)")
    ap.add_argument("--items", action="store_true", help="each turn a new one-message request of the suite's next "
                    "item (a templated job sent by many clients) instead of a conversation's follow-up")
    ap.add_argument("--warm-turns", type=int, default=0, help="with --items: each client's first N items sent "
                    "before the clock starts (a server that has been up: its earlier requests are what it drafts from)")
    ap.add_argument("--schemas", action="store_true", help="send each item's JSON schema (a structured suite's "
                    "'schema', e.g. --suite extract-json --items) as its response_format, to every server")
    ap.add_argument("--tools", choices=("auto", "required"), help="send the tool-calls suite's four tools with "
                    "this tool_choice in every request, to every server (with --items: e.g. --suite tool-calls "
                    "--items --tools required; llama-server takes tools only with a Jinja chat template, which "
                    "the embedded Gemma file lacks: compare with it under a --profile)")
    args = ap.parse_args()
    global USE_SCHEMAS, PROFILE, TOOL_CHOICE
    USE_SCHEMAS = args.schemas
    TOOL_CHOICE = args.tools
    PROFILE = args.profile
    if args.warm_turns and not args.items:
        ap.error("--warm-turns goes with --items (a conversation's first turns are part of it)")
    if args.tools and not args.items:
        ap.error("--tools goes with --items (a conversation would have to answer its calls)")
    reports = []
    for clients in args.clients:
        if args.base_url:
            reports.append(asyncio.run(load(args.base_url, args.api_key, clients, args.requests, args.max_tokens,
                                            "default", re.sub(r"^https?://", "", args.base_url), args.suite,
                                            args.items, args.warm_turns)))
            continue
        for server in args.servers.split(","):
            print(f"{server}: {clients} clients x {args.requests} turns ...", file=sys.stderr, flush=True)
            reports.append(run_server(server, clients, args))
    if args.json:
        print(json.dumps([{**asdict(r), "tokens_per_second": r.tokens_per_second} for r in reports], indent=1))
    else:
        print(table(reports))
        for server in dict.fromkeys(r.server for r in reports):  # which configuration each row ran
            if server in SERVERS:
                print(f"  {server}: {SERVERS[server]}")
        for r in reports:
            for sample in r.samples:
                print(f"  {r.server}: {sample}")
        for line in against_llama_server(reports):
            print(line)


if __name__ == "__main__":
    main()
