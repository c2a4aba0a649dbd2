"""`localspec batch`: a JSONL file of prompts through the batch scheduler, results appended as each one finishes."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localspec.cli import app, ctrl_c_as_request, user_errors
from localspec.cli.options import generation_options
from localspec.errors import UserError
from localspec.settings import Settings

if TYPE_CHECKING:
    from localspec.batch.files import ResultWriter
    from localspec.batch.result import Result
    from localspec.batch.run import Screen
    from localspec.bench.replay import CostTable
    from localspec.request import Request
    from localspec.runtime import BatchRuntime


def parse_parallel(value: str) -> int | None:
    """``auto`` (None: as many lanes as pay on this device) or a count of at least 1."""
    if value == "auto":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"--parallel must be 'auto' or a number of at least 1, got {value!r}")
    return n


@app.command()
@generation_options("batch", hide=("p_min",))
def batch(
    input_path: Annotated[Path, typer.Argument(metavar="IN.jsonl", help="Prompts, one JSON object a line.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="OUT.jsonl",
                                         help="Results, one JSON line per prompt; run again to resume. '-' (or a "
                                         "pipe): the lines on stdout, and no resuming.")],
    parallel: Annotated[str, typer.Option("--parallel", help="Sequences decoded together: 'auto' (as many as pay "
                                          "on this device's pass costs, at most 8) or a number.")] = "auto",
    chat: Annotated[bool, typer.Option("--chat", help="Wrap plain prompts in the model's chat template "
                                       "(`messages` lines always are).")] = False,
    summary: Annotated[Path | None, typer.Option("--summary", metavar="FILE",
                                                 help="Write the job's totals as JSON: counts for the "
                                                 "whole job (earlier runs included), measures for this run.")] = None,
    replay_costs: Annotated[str | None, typer.Option("--replay-costs", metavar="TABLE",
                                                     help="With --summary: also price the same job on a cost "
                                                     "table (h100, spr-2t, epyc-avx2-2t, or a file).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    *,
    options: Settings,
) -> None:
    """Generate from every prompt of IN.jsonl, many at a time, each one speculating.

    A line is {"id": ..., "prompt": ...} or {"id": ..., "messages": [...]}, with its own settings where it wants them.

    Line settings: an OpenAI body's (max_tokens, temperature, top_p, seed, stop,
    ...), read as serve reads them. They override the command's options.

    OpenAI Batch API lines (custom_id, method, url, body) work too, and get OpenAI Batch output lines.

    Each result is appended to OUT.jsonl as it finishes; the same command again
    skips the prompts already done. With -o - (or a pipe) the results go to
    stdout instead, and cannot be resumed.

    A bad line becomes an error record and the job goes on. Exit code 0: all succeeded; 1: some failed; 2: bad usage.

    Examples:

      localspec batch prompts.jsonl -o results.jsonl

      localspec batch requests.jsonl -o out.jsonl --parallel 4 --summary totals.json
    """
    from localspec.batch.files import ResultWriter, done_ids, is_stream, read_requests

    with user_errors():
        lanes = parse_parallel(parallel)
        table = None
        if replay_costs is not None:
            from localspec.bench.replay import load_cost_table

            table = load_cost_table(replay_costs)
            if not options.sampling.greedy:
                raise UserError("--replay-costs replays greedy jobs only: drop --temperature")
            if summary is None:
                raise UserError("--replay-costs writes its figures into the summary: add --summary FILE")
        stream = is_stream(output)
        check_paths(input_path, None if stream else output, summary)
        requests, bad = read_requests(input_path)
        done = set() if stream else done_ids(output)
        todo = [r for r in requests if r.id not in done]
        bad = [b for b in bad if b.id not in done]
        job = {"prompts": len(requests) + len(bad), "already_done": len(requests) - len(todo)}
        if done:
            _say(f"resuming {output}: {job['already_done']} of {job['prompts']} already done", False)
        if not todo and not bad:
            if summary is not None:
                _write_summary(summary, {**job, "ok": job["already_done"], "failed": 0, "ran": 0,
                                         **_Totals().measures(), "device": None, "parallel": 0})
            return
        ran = len(todo) + len(bad)
        with ExitStack() as stack:
            cancelled = stack.enter_context(ctrl_c_as_request())
            from localspec.batch.run import NothingToRun, Screen
            from localspec.opening import resolve
            from localspec.runtime import BatchRuntime, seeded_job

            screen = Screen(options, todo, chat)  # each line checked with the model's tokens before any measuring
            try:
                rt: BatchRuntime | None = stack.enter_context(BatchRuntime.open(
                    options, lanes, jobs=max(1, len(todo)), cancelled=cancelled,
                    seeded=seeded_job(todo, options.sampling), check=screen))
            except NothingToRun:  # not one line can run: nothing was measured
                rt = None
            writer = stack.enter_context(ResultWriter(output, resolve(options.model)[0] if rt is None
                                                      else rt.model_name))
            for line_error in bad:
                writer.write_error(line_error)
            for result in screen.failed:
                writer.write(result, todo[result.index])
            totals, results, device = _Totals(), [], {"device": None, "parallel": 0}
            if rt is not None:
                for notice in rt.notices:
                    _say(notice, quiet)
                if done:
                    _learn_done(rt, requests, output, chat)
                totals, results = _run(rt, screen, writer, cancelled, quiet)
                device = {"device": rt.device.description, "parallel": rt.parallel}
            failed = totals.failed + len(bad) + len(screen.failed)
            if summary is not None:  # while the model is open: a replay tokenizes the prompts again
                # the counts are the whole job's (a resumed run included what earlier runs did); the measures,
                # this run's
                doc = {**job, "ok": job["already_done"] + totals.ok, "failed": failed, "ran": ran,
                       **totals.measures(), **device}
                if table is not None and rt is not None:
                    doc["replayed"] = _replay(rt, screen.runs, results, table, chat)
                _write_summary(summary, doc)
        if totals.interrupted:
            again = ("run the same command again to resume" if not stream else
                     f"{output} is not a file, so nothing can be resumed from it: use -o FILE to be able to")
            _say(f"interrupted: {totals.ok + failed} of {ran} done; {again}", False)
            raise typer.Exit(130)
    where = "on stdout" if str(output) in ("-", "/dev/stdout") else f"in {output}"
    if failed:
        _say(f"{failed} of {ran} prompts failed: their error records are {where}", False)
        raise typer.Exit(1)
    _say(totals.line(where), quiet)


def _learn_done(rt: BatchRuntime, requests: list[Request], output: Path, chat: bool) -> None:
    """A resumed job drafts from what it already wrote, as if it had run on: each done request's prompt and
    output go into the history (where the history is kept on disk they may be there already: a second copy only
    weighs that continuation twice)."""
    from localspec.batch.files import done_texts
    from localspec.batch.run import prepare

    if rt.history is None:
        return
    texts = done_texts(output)
    for request in requests:
        text = texts.get(request.id)
        if text is None:
            continue
        try:
            prompt = prepare(rt, rt.settings, request, chat)[0]
        except UserError:
            continue
        rt.history.feed(prompt + rt.model.vocab.tokenize(text, add_special=False, parse_special=False))


@dataclass(slots=True)
class _Totals:
    """What one run of the job did (all zeros where nothing was left to run)."""

    ok: int = 0
    failed: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    cache_drafted: int = 0  # of them, drafts from earlier requests (the history)
    cache_accepted: int = 0
    seconds: float = 0.0
    passes: int = 0
    rows: int = 0
    shared_prefix_tokens: int = 0
    draft_steps: int = 0  # a draft model's: steps it drafted in, and its decodes over them (PassStats)
    draft_passes: int = 0
    draft_deepest: int = 0
    interrupted: bool = False

    def add(self, result: Result) -> None:
        if result.ok:
            self.ok += 1
        else:
            self.failed += 1
        self.generated_tokens += len(result.tokens)
        self.drafted += result.stats.drafted
        self.accepted += result.stats.accepted
        self.cache_drafted += result.stats.cache_drafted
        self.cache_accepted += result.stats.cache_accepted

    def line(self, where: str) -> str:
        """What the run did, in one line: the last thing a finished job prints (the progress bar goes away)."""
        rate = self.generated_tokens / self.seconds if self.seconds else 0.0
        drafts = f"{self.accepted} of {self.drafted} drafted tokens accepted" if self.drafted else "nothing drafted"
        if self.cache_drafted:
            drafts += f" ({self.cache_accepted} of {self.cache_drafted} drafted from earlier requests)"
        return (f"done: {self.ok} prompt(s), {self.generated_tokens} tokens in {self.seconds:.1f} s "
                f"({rate:.1f} tok/s); {drafts}; results {where}")

    def measures(self) -> dict[str, Any]:
        """The summary's measures of this run."""
        return {"generated_tokens": self.generated_tokens, "drafted": self.drafted, "accepted": self.accepted,
                "cache_drafted": self.cache_drafted, "cache_accepted": self.cache_accepted,
                "seconds": round(self.seconds, 3),
                "tokens_per_second": round(self.generated_tokens / self.seconds, 2) if self.seconds else 0.0,
                "passes": self.passes, "mean_rows_per_pass": round(self.rows / self.passes, 2) if self.passes else 0.0,
                "shared_prefix_tokens": self.shared_prefix_tokens, "draft_steps": self.draft_steps,
                "draft_passes": self.draft_passes, "draft_passes_deepest_step": self.draft_deepest,
                "interrupted": self.interrupted}


def check_paths(input_path: Path, output: Path | None, summary: Path | None) -> None:
    """Before any work: the results and the summary can be written, and neither would overwrite the prompts or
    each other (the same file under another name, a hard link or a symbolic link counts: files are compared, not
    names). ``output`` None: a stream."""
    named = [("IN.jsonl", input_path), ("-o", output), ("--summary", summary)]
    for i, (what, path) in enumerate(named):
        for other, other_path in named[:i]:
            if path is not None and other_path is not None and _same_file(path, other_path):
                mine, theirs = ("results", "summary")[what == "--summary"], ("prompts", "results")[other == "-o"]
                raise UserError(f"{other} {other_path} and {what} {path} are the same file: the {mine} would "
                                f"overwrite the {theirs}; write the {mine} to another file")
    for what, path in named[1:]:
        if path is not None:
            _writable(path, what)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): it cannot be the other
        return False


def _writable(path: Path, what: str) -> None:
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder: give the name of a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UserError(f"cannot write {what} {path}: permission denied")
        return
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"cannot write {what} {path}: there is no folder {folder}; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {what} {path}: the folder {folder} is not writable")


def _run(rt: BatchRuntime, screen: Screen, writer: ResultWriter, cancelled: Callable[[], bool],
         quiet: bool) -> tuple[_Totals, list[Result]]:
    """Run the requests the screen kept, writing each result as it finishes; the run's totals and its results."""
    from localspec.batch.run import run_requests
    from localspec.speculative.jobs import PassStats

    requests = screen.runs
    by_id = {r.id: r for r in requests}
    stats = PassStats()
    results: list[Result] = []
    totals = _Totals()
    start = time.perf_counter()
    with _progress(len(requests), quiet) as tick:
        for result in run_requests(rt, requests, chat=screen.chat, cancelled=cancelled, stats=stats,
                                   prepared=screen.prepared):
            if result.finish_reason == "interrupted":
                continue  # not written: it runs again when the job is resumed
            writer.write(result, by_id[result.id])
            results.append(result)
            totals.add(result)
            seconds = time.perf_counter() - start
            tick(totals.ok + totals.failed, totals.generated_tokens / seconds if seconds else 0.0,
                 totals.accepted / totals.drafted if totals.drafted else 0.0)
    totals.seconds = time.perf_counter() - start
    totals.passes, totals.rows, totals.shared_prefix_tokens = stats.passes, stats.rows, stats.shared_prefix_tokens
    totals.draft_steps, totals.draft_passes, totals.draft_deepest = (stats.draft_steps, stats.draft_passes,
                                                                     stats.draft_deepest)
    totals.interrupted = cancelled()
    return totals, results


@contextmanager
def _progress(total: int, quiet: bool) -> Iterator[Callable[[int, float, float], None]]:
    """Prompts done of the total, tokens per second, acceptance and the time left, on stderr (rich, as pull)."""
    if quiet:
        yield lambda done, rate, acceptance: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("prompts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=total, rate="")

        def tick(done: int, rate: float, acceptance: float) -> None:
            shown = f"{rate:.1f} tok/s" + (f", {acceptance:.0%} accepted" if acceptance else "")
            bar.update(task, completed=done, rate=shown)

        yield tick


def _replay(rt: BatchRuntime, requests: list[Request], results: list[Result], table: CostTable,
            chat: bool) -> dict[str, Any]:
    """The same job priced on ``table``: its outputs drafted again by the same scheduler and policy."""
    from localspec.batch.run import prepare
    from localspec.bench.replay import Known, replay_batch

    by_id = {r.id: r for r in requests}
    known = []
    for result in results:
        if result.ok:
            known.append(Known(prepare(rt, rt.settings, by_id[result.id], chat)[0], result.tokens,
                               result.stats.stop_reason == "eog"))
    if not known:
        return {}
    drafter = rt.settings.speculation.drafter
    got = replay_batch(drafter, known, table, rt.parallel, k=rt.settings.speculation.k)
    alone = replay_batch("none", known, table, 1)
    return {"table": table.source or table.device, "device": table.device, "seconds": round(got.seconds, 4),
            "tokens_per_second": round(got.tokens_per_second, 1), "passes": got.passes,
            "mean_rows_per_pass": round(got.rows / got.passes, 2) if got.passes else 0.0,
            "one_at_a_time_target_only_tokens_per_second": round(alone.tokens_per_second, 1)}


def _write_summary(path: Path, doc: dict) -> None:
    try:
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write the summary {path}: {e.strerror}") from None


def _say(text: str, quiet: bool) -> None:
    if not quiet:
        print(f"localspec: {text}", file=sys.stderr)

