"""`localspec calibrate`: measure what a pass of the target costs on this machine, now, and show it."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from localspec.cli import app, ctrl_c_as_request, user_errors
from localspec.cli.options import generation_options
from localspec.settings import Settings

if TYPE_CHECKING:  # `localspec --help` must not load llama_cpp (tests/test_import_order.py)
    from localspec.runtime import Runtime
    from localspec.speculative.calibrate import Progress


@app.command()
@generation_options("calibrate")
def calibrate(
    show: Annotated[bool, typer.Option(
        "--show", help="Print the figures in use (measured first only if there are none).")] = False,
    shapes: Annotated[bool, typer.Option(
        "--shapes", help="Also time passes of a steady size against passes right after a change of size (a GPU's "
        "CUDA graphs make the first cheaper; a CPU shows no difference), and say which sizes localspec keeps.",
    )] = False,
    noise: Annotated[bool, typer.Option(
        "--noise", help="Also measure how far this device's logits move between passes of 1, 4, 8 and 16 rows and "
        "the prefill the bench's lossless check scores with: the near-tie margins `bench` classifies divergences by.",
    )] = False,
    *,
    options: Settings,
) -> None:
    """Measure what a target pass of 1..17 tokens costs on this machine: the curve the draft length is chosen on.

    localspec measures it once per model and device, at the first run that
    drafts, and corrects it from every pass it makes afterwards. Measure again
    here after a change the cache cannot see (a BIOS setting, a driver update)
    or when the first measurement was taken on a busy machine (localspec says
    so). Other work running meanwhile makes the figures too high: the
    measurement says when it saw some.

    Examples:

      localspec calibrate

      localspec calibrate --show --gpu-layers 0

      localspec calibrate --shapes

      localspec calibrate --noise
    """
    from localspec.runtime import Runtime
    from localspec.speculative.calibrate import choose_reads, load_or_measure

    # the same target context a generation opens (so the same kind of pass), without a drafter to calibrate for
    settings = dataclasses.replace(options, speculation=dataclasses.replace(options.speculation, drafter="none"))
    with user_errors(), ctrl_c_as_request() as cancelled, Runtime.open(settings, cancelled=cancelled) as rt:
        from localspec.models.files import known_sha256

        args = (rt.context, known_sha256(rt.model.path), rt.device, settings.speculation.k_max + 1)
        if show:
            reads = rt.reads
            calibration = load_or_measure(*args, retry=False)
        else:
            reads = choose_reads(*args, again=True, cancelled=cancelled)
            with _progress_bar() as progress:
                calibration = load_or_measure(*args, again=True, progress=progress, cancelled=cancelled)
        print(f"{rt.model_name} on {calibration.device} ({rt.device.description}):")
        print(f"  {'tokens':>6}  {'ms':>7}  {'× 1 token':>9}  how")
        one = calibration.seconds[1]
        for n, seconds in sorted(calibration.seconds.items()):
            print(f"  {n:>6}  {seconds * 1000:>7.2f}  {seconds / one:>9.2f}  {calibration.measured.get(n, '')}")
        if reads is not None:
            print(f"localspec: greedy passes read back as {reads.describe()}", file=sys.stderr)
        state = f"provisional: {calibration.provisional}" if calibration.provisional else "measured on a quiet machine"
        print(f"localspec: {state}; cached in {calibration.path}", file=sys.stderr)
        if shapes:
            _print_shapes(rt, known_sha256(rt.model.path), settings.speculation.k_max + 1, cancelled=cancelled)
        if noise:
            _print_noise(rt, known_sha256(rt.model.path), cancelled)


def _print_noise(rt: Runtime, model_hash: str, cancelled: Callable[[], bool]) -> None:
    """This device's logit noise by pass size, measured again and cached (what `bench` classifies with)."""
    from localspec.speculative.noise import PROMPTS, load_or_measure_noise

    found = load_or_measure_noise(rt.context, model_hash, rt.device, [rt.prompt_tokens(p) for p in PROMPTS],
                                  again=True, cancelled=cancelled)
    print("the largest change of a top-5 pair's logit difference, by the rows of the pass that computed it:")
    print(f"  {'rows':>6}  {'against the prefill':>19}  {'against 1 row':>13}")
    for n in sorted(found.against_prefill):
        one = found.against_one_row.get(n)
        print(f"  {n:>6}  {found.against_prefill[n]:>19.3f}  {'–' if one is None else f'{one:.3f}':>13}")
    print(f"localspec: {found.describe()}", file=sys.stderr)


def _print_shapes(rt: Runtime, model_hash: str, n_max: int, cancelled: Callable[[], bool]) -> None:
    """Steady passes against passes after a change of size, and the sizes localspec keeps on this device."""
    from localspec.speculative.shape_timing import load_or_measure_timing, measure_shapes

    graphs = rt.device.graphs
    # where graphs run, timed again and cached (what the runs use); elsewhere the figures only show that a change
    # costs nothing: a few sizes, one round, are enough
    timing = load_or_measure_timing(rt.context, model_hash, rt.device, again=True, cancelled=cancelled)
    if timing is None:
        timing = measure_shapes(rt.context, (1, 2, 4), rounds=1, cancelled=cancelled)
    print("passes by where they stand in a CUDA graph's warm-up:")
    print(f"  {'tokens':>6}  {'steady ms':>9}  {'after a change':>14}  {'capture':>8}")
    for n, steady in sorted(timing.seconds["steady"].items()):
        after, capture = timing.seconds["after change"][n], timing.seconds["capture"][n]
        print(f"  {n:>6}  {steady * 1000:>9.2f}  {after * 1000:>11.2f} ms  {capture * 1000:>5.2f} ms")
    kept = timing.shapes(n_max) if graphs else None
    if kept is not None and kept.active:
        print(f"localspec: CUDA graphs: passes keep to {', '.join(map(str, kept.sizes))} rows, drafts padded up",
              file=sys.stderr)
    else:
        why = ("CUDA graphs in use, but a change of size costs nothing measurable" if graphs
               else "no CUDA graphs on this device")
        print(f"localspec: {why}: every draft length is its own pass size", file=sys.stderr)


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
