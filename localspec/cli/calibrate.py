"""`localspec calibrate`: measure what a pass of the target costs on this machine, now, and show it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from localspec.cli import app, ctrl_c_as_request, user_errors
from localspec.cli.options import generation_options
from localspec.settings import Settings

if TYPE_CHECKING:  # `localspec --help` must not load llama_cpp (tests/test_import_order.py)
    from localspec.speculative.calibrate import Progress


@app.command()
@generation_options("calibrate")
def calibrate(
    show: Annotated[bool, typer.Option(
        "--show", help="Print the figures in use (measured first only if there are none).")] = False,
    *,
    options: Settings,
) -> None:
    """Measure what a target pass of 1..17 tokens costs on this machine: the curve the draft length is chosen on.

    localspec measures it once per model and device, at the first run that drafts, and corrects it from every
    pass it makes afterwards. Measure again here after a change the cache cannot see (a BIOS setting, a driver
    update) or when the first measurement was taken on a busy machine (localspec says so). Other work running
    meanwhile makes the figures too high: the measurement says when it saw some.

    Examples:

      localspec calibrate

      localspec calibrate --show --gpu-layers 0
    """
    from localspec.runtime import Runtime
    from localspec.speculative.calibrate import choose_reads, load_or_measure

    # the same target context a generation opens (so the same kind of pass), without a drafter to calibrate for
    settings = dataclasses.replace(options, speculation=dataclasses.replace(options.speculation, drafter="none"))
    with user_errors(), ctrl_c_as_request() as cancelled, Runtime.open(settings, cancelled=cancelled) as rt:
        from localspec.models.files import known_sha256

        runtime = settings.runtime
        args = (rt.context, known_sha256(rt.model.path), runtime.threads(), runtime.n_gpu_layers,
                settings.speculation.k_max + 1)
        if show:
            reads = rt.reads
            calibration = load_or_measure(*args, retry=False)
        else:
            reads = choose_reads(*args, again=True, cancelled=cancelled)
            with _progress_bar() as progress:
                calibration = load_or_measure(*args, again=True, progress=progress, cancelled=cancelled)
        print(f"{rt.model_name} on {calibration.device} ({rt.device}):")
        print(f"  {'tokens':>6}  {'ms':>7}  {'× 1 token':>9}  how")
        one = calibration.seconds[1]
        for n, seconds in sorted(calibration.seconds.items()):
            print(f"  {n:>6}  {seconds * 1000:>7.2f}  {seconds / one:>9.2f}  {calibration.measured.get(n, '')}")
        if reads is not None:
            print(f"localspec: greedy passes read back as {reads.describe()}", file=sys.stderr)
        state = f"provisional: {calibration.provisional}" if calibration.provisional else "measured on a quiet machine"
        print(f"localspec: {state}; cached in {calibration.path}", file=sys.stderr)


@contextmanager
def _progress_bar() -> Iterator[Progress]:
    """A transient bar on stderr while the passes are timed; yields the callback that moves it."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("timing passes"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
             TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
