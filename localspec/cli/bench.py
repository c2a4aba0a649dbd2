"""`localspec bench`: what speculative decoding buys on *your* model, prompts and machine, with the lossless check.

The report (table, or --json) goes to stdout; progress, notices and warnings go to stderr.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from localspec.cli import app, ctrl_c_as_request, fail, user_errors
from localspec.cli.options import OPTIONS, generation_options
from localspec.errors import UserError
from localspec.settings import HistorySettings, Settings

if TYPE_CHECKING:
    from localspec.bench.replay import CostTable
    from localspec.bench.report import Report
    from localspec.bench.runner import Bench, Job, Outcome
    from localspec.bench.suite import Suite
    from localspec.opening import Checks

DEFAULT_DRAFTERS = "none,ngram,auto"  # plus `draft` when --draft is given; early-exit on request (it builds a file)


@app.command()
@generation_options("bench")
def bench(
    suite: Annotated[Path | None, typer.Option(
        "--suite", "-s", help="JSONL file of {id, category, prompt, max_tokens?} rows. Default: the built-in suite "
        "(grounded copy/extract/edit, code, chat, creative).")] = None,
    drafters: Annotated[str | None, typer.Option(
        "--drafters", help="Comma-separated drafters to compare: none, ngram, draft, early-exit, layer-skip, auto. "
        f"Default: {DEFAULT_DRAFTERS} (+ draft when --draft is given). Target-only (none) is always measured. "
        "NAME:kN pins one entry's draft length, NAME:bM its token-tree branches (NAME:kNbM both).")] = None,
    repeat: Annotated[int, typer.Option("--repeat", "-r", help="Runs of every (prompt, drafter); medians are "
                                        "reported.")] = 3,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", "-n", help="Tokens per prompt, overriding the suite's max_tokens.")] = None,
    anchors: Annotated[bool, typer.Option(
        "--anchors", help="Also time llama-cpp-python's Llama.create_completion, plain and with "
        "LlamaPromptLookupDecoding, on the same prompts.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Directory for bench.json, bench.md and bench.png (the chart needs matplotlib: "
        "pip install 'localspec\\[plot]'; --parallel draws none).")] = None,
    replay_costs: Annotated[str | None, typer.Option(
        "--replay-costs", help="Also price every run on another device's cost table (a shipped name: h100, "
        "epyc-avx2-2t, spr-2t; a cost-table JSON file; or a calibration cache file): the same outputs drafted "
        "again with the policy calibrated there, and the oracle lookup drafter as a ceiling. Marked as replayed.",
        rich_help_panel="Replay")] = None,
    parallel: Annotated[str | None, typer.Option(
        "--parallel", help="Run the suite as one batch of N sequences ('auto': as many as pay here) beside the same "
        "prompts one at a time, for each of --drafters (a draft model drafts every sequence at once); live, "
        "--repeat rounds (with --replay-costs, also priced on that table: the drafters that need no model).")] = None,
    job: Annotated[bool, typer.Option(
        "--job", help="Run the suite in order as one job: each prompt drafts from the prompts before it (their "
        "target-only answers, kept in memory; never a prompt's own runs), and what the drafts from them are worth "
        "carries over. Reports the job's first and second halves too. Shipped jobs: --suite template-emails, "
        "tool-calls, code-boilerplate, multi-turn.")] = False,
    *,
    options: Settings,
    given: dict[str, Any],
) -> None:
    """Benchmark drafters on a suite of prompts: tok/s, speedup, acceptance, and a lossless check of every run.

    Every (prompt, drafter) pair runs interleaved across repeats on one loaded model.

    Every greedy output is checked against target-only output; a divergence is
    classified as a near-tie or not by this device's own margin (how far its
    logits move with a pass's size: measured once, see `localspec calibrate
    --noise`), and the worst one is named.

    Examples:

      localspec bench --repeat 1 --max-tokens 64

      localspec bench --suite my_prompts.jsonl --drafters none,ngram --json

      localspec bench --anchors --out results/

      localspec bench --profile qwen2.5-7b --repeat 1

      localspec bench --drafters none,ngram,ngram:k3,ngram:k7 --replay-costs h100

      localspec bench --drafters none,ngram,ngram:b4 --replay-costs h100   (one chain against token trees)

      localspec bench --parallel auto --drafters none,ngram --replay-costs h100
    """
    from localspec.bench import output
    from localspec.bench import report as rep
    from localspec.bench.anchors import NAMES as anchor_names
    from localspec.bench.runner import Bench, halves, parse_drafters, split_variant, with_predictions
    from localspec.bench.suite import load_suite
    from localspec.engine import library_version
    from localspec.runtime import Runtime

    err = Console(stderr=True)
    with user_errors():
        # everything a user can get wrong is checked before a model is loaded
        if repeat < 1:
            raise UserError(f"--repeat must be at least 1, got {repeat}")
        if max_tokens is not None and max_tokens < 1:
            raise UserError(f"--max-tokens must be a positive number, got {max_tokens}")
        draft = options.speculation.draft_model
        spec = drafters if drafters is not None else DEFAULT_DRAFTERS + (",draft" if draft else "")
        if drafters is None and options.speculation.drafter not in spec.split(","):
            spec += f",{options.speculation.drafter}"  # a profile's own drafter, beside the default comparison
        names = parse_drafters(spec, draft_model=draft, anchors=anchors)
        the_suite = load_suite(suite).with_max_tokens(max_tokens)
        table = None
        if replay_costs is not None:
            from localspec.bench.replay import load_cost_table

            table = load_cost_table(replay_costs)
        if out is not None:
            output.check_writable(out)  # before minutes of benchmarking, not after
        if parallel is not None and job:
            raise UserError("--job runs the prompts one at a time, in order: leave --parallel out (a batch job drafts "
                            "from its earlier lines through `localspec batch`)")
        predicted = sum(p.prediction is not None for p in the_suite.prompts)
        if parallel is not None and predicted:
            raise UserError(f"--parallel runs no row with its prediction ({predicted} of this suite's rows have one): "
                            "leave --parallel out to run each drafter with and without them")
        if anchors and any(p.chat for p in the_suite.prompts):
            raise UserError("--anchors answer the raw prompt, not a chat row's template: leave --anchors out for a "
                            "suite of chat rows")
        runtime = options.runtime
        command = _command(
            suite=suite, drafters=drafters, repeat=repeat, max_tokens=max_tokens, replay_costs=replay_costs,
            anchors=anchors, out=out, parallel=parallel, job=job, **given,
        )
        if parallel is not None:
            return _bench_parallel(options, the_suite, names, parallel, repeat, named=drafters is not None,
                                   table=table, as_json=as_json, out=out, command=command)

        # a first Ctrl-C while the model loads stops the load (llama.cpp polls the flag); afterwards it interrupts
        # the benchmark, which then reports the runs that finished
        with ctrl_c_as_request() as cancelled:
            # bench decodes greedily and switches drafters per run: the runtime opens with none, and with a
            # sequence for every branch the widest entry (NAME:bM) may verify
            widest = max([options.speculation.branches, *(split_variant(n)[2] or 1 for n in names
                                                           if n not in anchor_names)])
            # earlier prompts are drafted from only in a --job, in memory, fed by the bench itself (never from a
            # prompt's own runs); a bench never reads or writes the history kept on disk
            history = HistorySettings("memory" if job else "off")
            opened = Runtime.open(replace(options, speculation=replace(options.speculation, drafter="none",
                                                                       branches=widest), history=history),
                                  cancelled=cancelled, check=lambda c: _check(c, the_suite, names, options))
            if opened.history is not None:
                opened.history.frozen = True
        with opened as rt:
            for notice in rt.notices:
                _note(f"localspec: {notice}")
            anchor_set = None
            if anchors:
                from localspec.bench.anchors import Anchors

                anchor_set = Anchors(rt.model.path, n_ctx=rt.n_ctx, n_threads=runtime.threads(),
                                     n_gpu_layers=runtime.n_gpu_layers)
            try:
                names = with_predictions(names, the_suite)
                runner = Bench(rt, the_suite, names, repeat, anchor_set, branches=options.speculation.branches,
                               job=job)
                outcome = _run_with_progress(runner, runner.jobs(), err)
                runner.check(outcome.records)
            finally:
                if anchor_set is not None:
                    anchor_set.close()
            machine = rep.machine_info(runtime.threads(), runtime.n_gpu_layers, library_version(),
                                       rt.device.description)
            common = dict(model=rt.model_name, machine=machine, suite=the_suite.name, command=command, repeat=repeat,
                          categories=the_suite.categories, interrupted=outcome.interrupted,
                          planned_runs=outcome.planned, margin=runner.margins["prefill"])
            report = rep.build_report(outcome.records, drafters=names, **common)
            replayed = None
            if table is not None:
                try:
                    replayed = _replay(outcome.records, runner, table, names, options, common)
                except UserError as exc:  # the measured report must survive a replay that cannot be made
                    _note(f"localspec: no replay: {exc}")

        job_halves = halves(outcome.records, [p.id for p in the_suite.prompts]) if job else None
        _print_report(report, replayed, as_json, err, job_halves)
        if out is not None:
            files, warning = output.write_outputs(report, out, replayed)
            if warning:
                _note(f"localspec: {warning}; {', '.join(str(f) for f in files)} written")
            else:
                _note(f"localspec: wrote {', '.join(str(f) for f in files)}")
    if outcome.interrupted:
        raise fail(f"interrupted: the report covers the {len(outcome.records)} of {outcome.planned} runs "
                   "that finished", 130)


def _check(checks: Checks, suite: Suite, names: list[str], options: Settings) -> None:
    """What the model can tell before anything is measured: every row fits, every self-drafter's layers exist, a
    draft model's tokenizer is the target's."""
    from localspec.bench.runner import split_variant
    from localspec.opening import check_draft_tokenizer, check_self_draft

    suite.check(checks)
    for drafter in dict.fromkeys(split_variant(name)[0] for name in names):
        speculation = replace(options.speculation, drafter=drafter)
        check_self_draft(speculation, checks.model)
        check_draft_tokenizer(speculation, checks.model)


def _run_with_progress(runner: Bench, jobs: list[Job], err: Console) -> Outcome:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from localspec.bench.runner import Outcome
    # the bar advances by each run's token budget, not by run count: a 200-token run takes longer than a 50
    budget = [runner.suite.prompts[j.prompt_index].max_tokens for j in jobs]
    done_before = [sum(budget[:i]) for i in range(len(jobs) + 1)]
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[runs]}"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err,
                  transient=True) as progress:
        warm = progress.add_task("warming up", total=len(runner.drafters), runs="")

        def on_warmup(done: int, total: int, job: Job | None, what: str) -> None:
            progress.update(warm, completed=done, description=what)

        try:
            runner.warm_up(on_warmup)
        except KeyboardInterrupt:
            return Outcome(interrupted=True, planned=len(jobs))
        progress.remove_task(warm)
        task = progress.add_task("measuring", total=done_before[-1], runs=f"0/{len(jobs)} runs")

        def on_job(done: int, total: int, job: Job | None, what: str) -> None:
            progress.update(task, completed=done_before[done], description=what, runs=f"{done}/{total} runs")

        outcome = runner.run(on_job)
    return outcome


def _replay(records: list, runner: Bench, table: CostTable, names: list[str], options: Settings,
            common: dict) -> Report:
    """The same runs priced on ``table``; anchors and the drafters that need a model to draft are left out, with
    a note."""
    from localspec.bench import report as rep
    from localspec.bench.replay import ORACLE, replay_records

    measured_with, ours = table.model, runner.rt.model.path.name
    if measured_with and measured_with != ours:
        _note(f"localspec: warning: {table.source} was measured with {measured_with}, this run's model is {ours}: "
              "the replay prices these outputs on that model's pass costs")
    prompts = {p.id: runner.prompt_tokens(p) for p in runner.suite.prompts}
    priced, skipped = replay_records(records, prompts, table, fixed_k=options.speculation.k,
                                     with_draft_model=options.speculation.draft_model is not None,
                                     branches=options.speculation.branches)
    if skipped:
        _note(f"localspec: not replayed: {', '.join(skipped)} (anchors, and drafters that draft with a model, "
              f"whose cost on {table.device} the table does not hold)")
    drafters = [n for n in names if n not in skipped] + [ORACLE]
    return rep.build_report(priced, drafters=drafters, replayed_on=f"{table.device} ({table.source})", **common)


def _print_report(report: Report, replayed: Report | None, as_json: bool, err: Console,
                  job_halves: dict[str, dict[str, float]] | None = None) -> None:
    from localspec.bench import formats
    from localspec.bench.report import NOISE

    if as_json:
        doc = formats.to_document(report, replayed)
        if job_halves is not None:
            doc["job_halves"] = job_halves
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        console = err  # the table is still useful to a person; stdout stays pure JSON
    else:
        # when stdout is a file or a pipe rich assumes 80 columns; the table needs more to stay one line per row
        console = Console() if sys.stdout.isatty() else Console(width=140)
    console.print(formats.render_table(report))
    if job_halves is not None:
        console.print("As one job (tokens over seconds, every repeat): first half · second half of the prompts",
                      highlight=False, markup=False)
        for drafter, row in job_halves.items():
            cells = [f"{row.get(h, 0.0):.1f} tok/s" + (f" ({row[h + '_speedup']:.2f}x)" if h + "_speedup" in row
                                                         else "") for h in ("first", "second")]
            console.print(f"  {drafter:<12} {cells[0]:>22} · {cells[1]:>22}", highlight=False, markup=False)
    for line in formats.divergence_lines(report):
        console.print(f"  {line}", highlight=False, markup=False)
    if replayed is not None:
        console.print(formats.render_table(replayed))
    unstable = report.unstable()
    if unstable:
        worst = max(unstable, key=lambda r: r.spread or 0.0)
        _note(f"localspec: warning: the repeats of {len(unstable)} (prompt, drafter) pair(s) disagree by more than "
              f"{NOISE:.0%} (worst: {worst.prompt_id} · {worst.drafter}, {worst.spread:.0%}): the machine was "
              "busy or the runs are too short; rerun on a quiet machine or with more --repeat")
    worst = report.worst_divergence()
    if worst is not None:
        r, rep, d = worst
        where = f"{r.prompt_id} · {r.drafter} · repeat {rep + 1}, token {d.position}"
        how = " (measured as target-only decoded it)" if d.path == "decode" else ""
        if d.near_tie is False:
            beyond = sum(1 for *_, x in report.divergences() if x.near_tie is False)
            _note(f"localspec: warning: {beyond} output(s) differ from target-only beyond this device's "
                  f"{report.margin:.2f}-logit noise margin: not a numerical near-tie (please report it); worst: "
                  f"{where}, logit gap {d.gap:.2f}{how}")
        else:
            _note(f"localspec: every divergence from target-only is a near-tie: largest logit gap {d.gap:.2f} "
                  f"({where}), margin {report.margin:.2f}")


def _note(line: str) -> None:
    print(line, file=sys.stderr)  # plain, not rich: messages are never wrapped or styled


def _command(**given: object) -> str:
    """The command line that reproduces this run (recorded in the report): every option that was given (a shared
    option at its declared default, such as ``--branches 1``, is left out)."""
    flags = {o.name: o.flags[0] for o in OPTIONS}
    defaults = {o.name: o.default for o in OPTIONS}
    parts = ["localspec", "bench"]
    for name, value in given.items():
        if name in defaults and value == defaults[name]:
            continue
        flag = flags.get(name, f"--{name.replace('_', '-')}")
        if isinstance(value, Path):  # relative to where it ran: the report must not carry this machine's paths
            value = os.path.relpath(value)
        if value is True:
            parts.append(flag)
        elif value is not None and value is not False:
            parts += [flag, shlex.quote(str(value))]
    return " ".join(parts)


def _bench_parallel(options: Settings, suite: Suite, names: list[str], parallel: str, repeat: int, named: bool, *,
                    table: CostTable | None, as_json: bool, out: Path | None, command: str) -> None:
    """The suite as one batch beside one at a time: live here, and priced on ``table`` when one is given; the
    tables on stdout (--json: one JSON object there, the tables on stderr), and in ``out``.
    ``named``: the user listed the drafters (--drafters), so an entry a batch cannot run is refused, not dropped."""
    from localspec.bench import output
    from localspec.bench import parallel as par
    from localspec.bench.anchors import NAMES as anchor_names
    from localspec.bench.report import machine_info
    from localspec.bench.runner import split_variant
    from localspec.cli.batch import parse_parallel
    from localspec.engine import library_version
    lanes = parse_parallel(parallel)
    if any(name in anchor_names for name in names):
        raise UserError("--parallel does not run the anchors (llama-cpp-python's own API runs one prompt at a time): "
                        "leave --anchors out")
    drafters = []
    for name in names:
        drafter, _, branches = split_variant(name)
        if (branches or 1) == 1:
            drafters.append(name)  # NAME:kN runs too, each sequence with that fixed length
        elif named:
            raise UserError(f"--parallel batches one chain per sequence, no token trees: drop {name} from --drafters "
                            "(or run it without --parallel)")
    measured = par.live(options, suite, drafters, lanes, repeat, _note)
    runtime = options.runtime
    report = par.ParallelReport(
        measured.model, machine_info(runtime.threads(), runtime.n_gpu_layers, library_version(), measured.device),
        suite.name, command, repeat, measured.lanes, measured.ways)
    if table is not None:
        if options.sampling.greedy and measured.known:
            report = replace(report, replayed_on=f"{table.device} ({table.source})",
                             replayed=par.replayed(measured.known, drafters, measured.lanes, table))
        else:  # the replay drafts the batch's greedy outputs again
            _note("localspec: no replay: the batch produced no greedy output to replay")
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=False) + "\n")
        sys.stdout.flush()
        print(report.tables(), file=sys.stderr)  # for a person; stdout stays pure JSON
    else:
        print(report.tables())
    if out is not None:
        files = output.write_document(report.to_json(), report.to_markdown(), out)
        _note(f"localspec: wrote {', '.join(str(f) for f in files)}")
