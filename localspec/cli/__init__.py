"""The `localspec` command: one typer app, one module per command.

Errors a user can act on (:class:`localspec.errors.UserError`) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperGroup

from localspec._version import __version__
from localspec.errors import UserError


class _Group(TyperGroup):
    """typer 0.29 prints a value placeholder (``<bool>``) beside every flag, --help included, as if it took one;
    here each command's flags get a blank one when the command is looked up (for help or for running it)."""

    def get_params(self, ctx: Any) -> list[Any]:
        _blank_flag_placeholders(self, ctx)
        return super().get_params(ctx)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _blank_flag_placeholders(command, ctx)
        return command

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Usage errors (an unknown option, a value that is not a number) are one line and exit code 2 like every
        other bad input, instead of typer's boxed usage panel."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)  # an Exit's code comes back as result
        except typer.Abort:
            print("localspec: interrupted", file=sys.stderr)
            sys.exit(130)
        except Exception as exc:
            if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
                raise  # not click's usage or parameter error: a bug, to be seen as one
            if type(exc).__name__ == "NoArgsIsHelpError":  # `localspec` alone: the help is the answer
                exc.show()  # type: ignore[attr-defined]
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            print(f"localspec: error: {exc.format_message()}{hint}", file=sys.stderr)
            sys.exit(exc.exit_code)
        sys.exit(result if isinstance(result, int) else 0)


def _blank_flag_placeholders(command: Any, ctx: Any) -> None:
    help_option = command.get_help_option(ctx)  # created once and cached by the command
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


app = typer.Typer(
    cls=_Group,
    name="localspec",
    help="Lossless speculative decoding for local GGUF models: faster generation, same output.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(f"localspec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Lossless speculative decoding for local GGUF models: faster generation, same output.

    Start with `localspec run "your prompt"`; `localspec COMMAND --help` explains each command.
    """


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line to stderr and return the Exit to raise."""
    print(f"localspec: error: {message}", file=sys.stderr)
    return typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError raised inside a command into one line on stderr and exit code 2.

    Ctrl-C becomes one line and exit code 130: typer would otherwise exit 130 without a word.
    """
    try:
        yield
    except UserError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
    except BrokenPipeError:
        # The reader went away (`localspec models | head -1`): it has what it wanted. Stop quietly, and point
        # stdout at /dev/null so that the final flush does not fail again on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None


@contextmanager
def ctrl_c_as_request() -> Iterator[Callable[[], bool]]:
    """Within the block, the first Ctrl-C only raises a flag (yielded as a poll function); a second one interrupts.

    A KeyboardInterrupt lands wherever Python happens to be, often in the caller's printing code, where the
    generation's final stats are lost. A polled flag lets the loop finish its step and report.

    While llama.cpp runs (a model load), Python handles the signal inside the next callback llama.cpp makes into
    Python; an exception raised there is printed as "Exception ignored …" and dropped. So a KeyboardInterrupt
    that a C callback swallowed counts as a request too, silently.
    """
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield requested.is_set  # signals go to the main thread only; an ignored SIGINT (a background job) stays so
        return

    def on_sigint(signum: int, frame: object) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous_hook = sys.unraisablehook

    def on_unraisable(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            requested.set()
            return
        previous_hook(unraisable)

    previous = signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = on_unraisable
    try:
        yield requested.is_set
    finally:
        sys.unraisablehook = previous_hook
        # None: the old handler was installed from C and cannot be put back; Python's default is the next best
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _register() -> None:
    # Imported for their side effect of adding commands to `app`; each module owns one command.
    import importlib

    for name in ("run", "pull", "models", "bench", "chat", "calibrate", "batch", "serve", "rpc_server", "cache"):
        importlib.import_module(f"localspec.cli.{name}")
    # The command list shows a docstring's first paragraph with its line breaks kept (typer, rich mode), so a
    # summary that wraps in the source reads as cut mid-sentence: give each command its summary as one line.
    for info in app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if info.short_help is None and doc:
            info.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


_register()


def main() -> None:
    try:
        app()
    except UserError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        sys.exit(130)
