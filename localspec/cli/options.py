"""Generation options shared by run, chat and bench: declared once, listed in each command's signature."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from localspec.settings import (
    DRAFTERS,
    GenerationSettings,
    RuntimeSettings,
    SamplingSettings,
    SpeculationSettings,
)

_MODEL = "Model"
_SPEC = "Speculation"
_SAMPLING = "Sampling"
_RUNTIME = "Runtime"

ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model name from `localspec models`, or a path to a .gguf file. "
                 "Default: the embedded gemma3-270m.", rich_help_panel=_MODEL),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="A target/draft profile from models.toml (sets --model, --drafter, "
                 "--draft, --k, --exit-layer unless given).", rich_help_panel=_MODEL),
]
DrafterOpt = Annotated[
    str | None,
    typer.Option("--drafter", "-d", help=f"Who proposes tokens: {' | '.join(DRAFTERS)}. 'auto' (default) uses "
                 "n-gram lookup where the text repeats, the draft model if one is given, else plain decoding.",
                 rich_help_panel=_SPEC),
]
DraftOpt = Annotated[
    str | None,
    typer.Option("--draft", help="Draft model (name or path) for --drafter draft/auto; must share the "
                 "target's tokenizer.", rich_help_panel=_SPEC),
]
KOpt = Annotated[
    int | None,
    typer.Option("--k", help="Fixed draft length. Default: adaptive, chosen each step from measured "
                 "acceptance and costs (0 = plain decoding).", rich_help_panel=_SPEC),
]
ExitLayerOpt = Annotated[
    int | None,
    typer.Option("--exit-layer", help="Layers kept for --drafter early-exit (default: a third of the model).",
                 rich_help_panel=_SPEC),
]
PMinOpt = Annotated[
    float,
    typer.Option("--p-min", help="Stop a model draft early when the draft's top probability falls below this.",
                 rich_help_panel=_SPEC),
]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", "-n", help="Most tokens to generate.", rich_help_panel=_SAMPLING)
]
TemperatureOpt = Annotated[
    float, typer.Option("--temperature", "-t", help="0 = greedy (the likeliest token at every step).",
                        rich_help_panel=_SAMPLING)
]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k likeliest tokens (0 = off).",
                                      rich_help_panel=_SAMPLING)]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).",
                                        rich_help_panel=_SAMPLING)]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p × the likeliest (0 = off).",
                                        rich_help_panel=_SAMPLING)]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="Seed for sampling. The same seed, options and model on the same machine give the same text when "
    "the draft lengths are fixed (--k N, or --drafter none); adaptive lengths follow live timings, so a near-tie "
    "can rarely go the other way (batch numerics).", rich_help_panel=_SAMPLING)]
StopOpt = Annotated[
    list[str] | None,
    typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed.",
                 rich_help_panel=_SAMPLING),
]
CtxOpt = Annotated[int, typer.Option("--ctx", help="Context size in tokens.", rich_help_panel=_RUNTIME)]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="CPU threads (default: all cores).",
                                                rich_help_panel=_RUNTIME)]
GpuLayersOpt = Annotated[
    int | None,
    typer.Option("--gpu-layers", help="Layers to offload to the GPU (-1 = all, 0 = none). Default: all where this "
                 "llama-cpp-python can offload (a CUDA/Metal build with a GPU), else 0.", rich_help_panel=_RUNTIME),
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's own log on stderr.",
                                          rich_help_panel=_RUNTIME)]


@dataclass(frozen=True, slots=True)
class Options:
    """Everything a generation face needs, validated, after a profile has filled what the user left out."""

    model: str | None
    runtime: RuntimeSettings
    speculation: SpeculationSettings
    sampling: SamplingSettings
    generation: GenerationSettings


def build_options(
    *,
    model: str | None,
    profile: str | None,
    drafter: str | None,
    draft: str | None,
    k: int | None,
    exit_layer: int | None,
    p_min: float,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int | None,
    stop: list[str] | None,
    ctx: int,
    threads: int | None,
    gpu_layers: int | None,
    verbose: bool,
) -> Options:
    if profile is None and model is None:  # models.toml's `default` may name a profile: all of it applies
        from localspec.models.registry import default_profile

        profile = default_profile()
    if profile is not None:
        from localspec.models.registry import resolve_profile

        p = resolve_profile(profile)
        model = model if model is not None else p.target
        drafter = drafter if drafter is not None else p.drafter
        draft = draft if draft is not None else p.draft
        k = k if k is not None else p.k
        exit_layer = exit_layer if exit_layer is not None else p.exit_layer
    if drafter is None:
        drafter = "auto"
    options = Options(
        model=model,
        runtime=RuntimeSettings(n_ctx=ctx, n_threads=threads, n_gpu_layers=gpu_layers, verbose=verbose),
        speculation=SpeculationSettings(drafter=drafter, draft_model=draft, k=k, exit_layer=exit_layer,
                                        p_min=p_min),
        sampling=SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed),
        generation=GenerationSettings(max_tokens=max_tokens, stop=tuple(stop or ())),
    )
    for part in (options.runtime, options.speculation, options.sampling, options.generation):
        part.validate()
    return options


# (name, option, default) of every shared generation option, in --help order
_SHARED: tuple[tuple[str, Any, Any], ...] = (
    ("model", ModelOpt, None), ("profile", ProfileOpt, None), ("drafter", DrafterOpt, None),
    ("draft", DraftOpt, None), ("k", KOpt, None), ("exit_layer", ExitLayerOpt, None), ("p_min", PMinOpt, 0.0),
    ("max_tokens", MaxTokensOpt, 256), ("temperature", TemperatureOpt, 0.0), ("top_k", TopKOpt, 40),
    ("top_p", TopPOpt, 0.95), ("min_p", MinPOpt, 0.05), ("seed", SeedOpt, None), ("stop", StopOpt, None),
    ("ctx", CtxOpt, 4096), ("threads", ThreadsOpt, None), ("gpu_layers", GpuLayersOpt, None),
    ("verbose", VerboseOpt, False),
)  # fmt: skip


def generation_options(*, hide: tuple[str, ...] = (), **defaults: Any) -> Callable[[Callable[..., Any]], Any]:
    """Give a command every shared generation option, validated into one ``options: Options`` argument.

    The command declares only its own parameters plus ``options``; ``defaults`` changes an option's default for
    this command, ``hide`` leaves an option out (it then keeps its default).
    """

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "options"]
        shared = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name, default), annotation=opt)
            for name, opt, default in _SHARED
            if name not in hide
        ]
        fixed = {name: defaults.get(name, default) for name, _, default in _SHARED if name in hide}

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name, _, _ in _SHARED if name not in hide}
            from localspec.cli import user_errors

            with user_errors():
                options = build_options(**fixed, **values)
            return command(options=options, **kwargs)

        run.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        return run

    return wrap
