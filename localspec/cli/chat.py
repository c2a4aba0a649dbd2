"""`localspec chat`: the interactive face; a Textual app that streams answers and shows the speculation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localspec.cli import app, user_errors
from localspec.cli.options import (
    CtxOpt,
    DrafterOpt,
    DraftOpt,
    ExitLayerOpt,
    GpuLayersOpt,
    KOpt,
    MaxTokensOpt,
    MinPOpt,
    ModelOpt,
    PMinOpt,
    ProfileOpt,
    SeedOpt,
    StopOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    build_options,
)
from localspec.errors import UserError


@app.command()
def chat(
    model: ModelOpt = None,
    profile: ProfileOpt = None,
    drafter: DrafterOpt = None,
    draft: DraftOpt = None,
    k: KOpt = None,
    exit_layer: ExitLayerOpt = None,
    p_min: PMinOpt = 0.0,
    max_tokens: MaxTokensOpt = 1024,
    temperature: TemperatureOpt = 0.7,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    stop: StopOpt = None,
    system: Annotated[str | None, typer.Option("--system", help="System message that opens the conversation.")] = None,
    ctx: CtxOpt = 8192,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    save_dir: Annotated[
        Path | None, typer.Option("--save-dir", help="Where Ctrl+S writes transcripts (default: the current folder).")
    ] = None,
) -> None:
    """Chat with a model in the terminal and watch the speculation: drafted tokens the model accepted are
    green, rejected drafts flash struck-through, and a side panel shows tok/s and acceptance live.

    Keys: Enter send · Esc stop · F2 next drafter · Ctrl+G rejected drafts · Ctrl+L clear · Ctrl+S save ·
    F1 or ? help · Ctrl+Q quit. `--temperature 0` makes answers deterministic (greedy).

    Examples:

      localspec chat

      localspec chat --drafter ngram --temperature 0 --system "Answer briefly."
    """
    with user_errors():
        options = build_options(
            model=model, profile=profile, drafter=drafter, draft=draft, k=k, exit_layer=exit_layer, p_min=p_min,
            max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
            stop=stop, ctx=ctx, threads=threads, gpu_layers=gpu_layers, verbose=False,
        )
        if save_dir is not None and not save_dir.is_dir():
            raise UserError(f"--save-dir {save_dir} is not a folder")
    _prepare_model(options.model)

    from localspec.tui.app import ChatApp

    ChatApp(options, system=system, save_dir=save_dir).run()


def _prepare_model(spec: str | None) -> None:
    """Assemble the embedded model (or find a pulled one) before the full-screen app takes the terminal.

    Assembling prints progress that a full-screen app would hide; any failure here is left for the app to show
    as a notice, where the user sees it alongside what to do next.
    """
    from localspec.registry import resolve_model

    try:
        resolve_model(spec)
    except UserError:
        pass
