"""The generation options of run, chat and bench: each declared once (flags, type, default, help, where its value
goes, which commands take it), and from that table every command's signature and the settings it builds."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from localspec.errors import UserError
from localspec.settings import (
    BRANCHES_DEFAULT,
    DRAFTERS,
    HISTORY_ENV,
    GenerationSettings,
    HistorySettings,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)

_ALL = ("run", "chat", "bench")
_GENERATE = ("run", "chat", "batch", "serve")  # bench decodes greedily, with its own drafter list and token budgets
# what sets the model and the device a pass runs on: calibrate measures that
_DEVICE = (*_ALL, "calibrate", "batch", "serve")


@dataclass(frozen=True, slots=True)
class Opt:
    """One option. ``goes_to`` is where its value lands in :class:`Settings` ("runtime.n_ctx"); model and profile
    are resolved by :func:`build_options` itself."""

    name: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str
    panel: str
    goes_to: str
    commands: tuple[str, ...] = _ALL

    def annotation(self) -> Any:
        return Annotated[self.type, typer.Option(*self.flags, help=self.help, rich_help_panel=self.panel)]


OPTIONS: tuple[Opt, ...] = (
    Opt("model", ("--model", "-m"), str | None, None, "Model name from `localspec models`, or a path to a .gguf "
        "file. Default: the embedded gemma3-270m.", "Model", "model", _DEVICE),
    Opt("profile", ("--profile", "-p"), str | None, None, "A target/draft profile from models.toml (sets --model, "
        "--drafter, --draft, --k, --exit-layer, --rpc unless given).", "Model", "profile", _DEVICE),
    Opt("drafter", ("--drafter", "-d"), str | None, None, f"Who proposes tokens: {' | '.join(DRAFTERS)}. 'auto' "
        "(default) uses n-gram lookup where the text repeats, the draft model if one is given, else plain decoding.",
        "Speculation", "speculation.drafter", _GENERATE),
    Opt("draft", ("--draft",), str | None, None, "Draft model (name or path) for --drafter draft/auto; must share "
        "the target's tokenizer. In batch and serve every sequence's drafts come from it at once, one draft pass per "
        "drafted token.", "Speculation", "speculation.draft_model", (*_ALL, "batch", "serve")),
    Opt("k", ("--k",), int | None, None, "Fixed draft length. Default: adaptive, chosen each step from measured "
        "acceptance and costs (0 = plain decoding).", "Speculation", "speculation.k", (*_ALL, "batch", "serve")),
    Opt("branches", ("--branches",), int, BRANCHES_DEFAULT, "Most candidate continuations n-gram lookup may verify "
        "together in one pass, as a token tree (the policy picks how many pay on this device). Default 1: one "
        "chain; trees did not pay in our measurements yet (docs/performance-features.md), and a GPU with CUDA "
        "graphs verifies chains only.", "Speculation", "speculation.branches"),
    Opt("exit_layer", ("--exit-layer",), int | None, None, "Layers kept for --drafter early-exit (default: a third "
        "of the model).", "Speculation", "speculation.exit_layer", (*_ALL, "batch", "serve")),
    Opt("skip_layers", ("--skip-layers",), str | None, None, "Blocks --drafter layer-skip leaves out, numbered "
        "from 0, e.g. 8-19 or 4,6-9: the draft is the target's other blocks, its first and last kept (built once "
        "as a file in the cache). Default: the middle third. Agreement and speed by subset: "
        "docs/performance-features.md.",
        "Speculation", "speculation.skip_layers", (*_ALL, "batch", "serve")),
    Opt("p_min", ("--p-min",), float, 0.0, "Stop a model draft early when the draft's top probability falls below "
        "this.", "Speculation", "speculation.p_min", _GENERATE),
    Opt("keep_history", ("--keep-history/--no-keep-history",), bool | None, None, "Keep the requests' tokens on "
        "disk (the cache folder, per model; `localspec cache` shows and clears it) so later runs draft from them, or "
        f"only in memory while this command runs. Default: kept for run, chat and batch, in memory for serve; "
        f"{HISTORY_ENV}=memory|off lowers the default (it never makes serve keep text on disk).", "Speculation",
        "history.mode", _GENERATE),
    Opt("max_tokens", ("--max-tokens", "-n"), int, 256, "Most tokens to generate.", "Sampling",
        "generation.max_tokens", _GENERATE),
    Opt("max_tokens_cap", ("--max-tokens-cap",), int | None, None, "Most tokens one request may ask for (its "
        "max_tokens); a request over it is refused (serve: 400; batch: an error record). Default: no cap but the "
        "context.", "Sampling", "generation.max_tokens_cap", ("batch", "serve")),
    Opt("temperature", ("--temperature", "-t"), float, 0.0, "0 = greedy (the likeliest token at every step).",
        "Sampling", "sampling.temperature", _GENERATE),
    Opt("top_k", ("--top-k",), int, 40, "Keep the k likeliest tokens (0 = off).", "Sampling", "sampling.top_k",
        _GENERATE),
    Opt("top_p", ("--top-p",), float, 0.95, "Nucleus sampling mass (1 = off).", "Sampling", "sampling.top_p",
        _GENERATE),
    Opt("min_p", ("--min-p",), float, 0.05, "Drop tokens below min-p × the likeliest (0 = off).", "Sampling",
        "sampling.min_p", _GENERATE),
    Opt("seed", ("--seed",), int | None, None, "Seed for sampling (--temperature > 0). The same command with the "
        "same seed gives the same text every time on the same machine and build, history on or off: its draft "
        "lengths follow this machine's measured pass costs, not live timings, and it drafts from its own text, not "
        "from earlier requests. Not promised: on another machine, build or --threads, after the pass costs are "
        "measured again, with another drafter or --k, nor in a batch against alone (docs/speculation.md).",
        "Sampling", "sampling.seed", _GENERATE),
    Opt("stop", ("--stop",), list[str] | None, None, "Stop when this text appears (repeatable); it is not printed.",
        "Sampling", "generation.stop", _GENERATE),
    Opt("ctx", ("--ctx",), int, 4096, "Context size in tokens.", "Runtime", "runtime.n_ctx", _DEVICE),
    Opt("threads", ("--threads",), int | None, None, "CPU threads (default: all cores).", "Runtime",
        "runtime.n_threads", _DEVICE),
    Opt("gpu_layers", ("--gpu-layers",), int | None, None, "Layers to offload to the GPU (-1 = all, 0 = none). "
        "Default: all where this llama-cpp-python can offload (a CUDA/Metal build with a GPU), else 0.", "Runtime",
        "runtime.n_gpu_layers", _DEVICE),
    Opt("verbose", ("--verbose",), bool, False, "Show llama.cpp's own log on stderr.", "Runtime", "runtime.verbose",
        _DEVICE),
    Opt("rpc", ("--rpc",), str | None, None, "Put the target's layers on llama.cpp RPC servers (HOST:PORT[,...], "
        "started with `localspec rpc-server`); the draft model stays here. Needs scripts/setup --rpc.", "Runtime",
        "runtime.rpc", _DEVICE),
    Opt("tensor_split", ("--tensor-split",), str | None, None, "With --rpc: each server's share of the layers, "
        "e.g. 3,1 (default: by their free memory).", "Runtime", "runtime.tensor_split", _DEVICE),
)
DEFAULTS: dict[str, Any] = {o.name: o.default for o in OPTIONS}
_PARTS = {"runtime": RuntimeSettings, "speculation": SpeculationSettings, "sampling": SamplingSettings,
          "generation": GenerationSettings, "history": HistorySettings}


def _floats(value: str | None) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in value.split(",")) if value else ()
    except ValueError:
        raise UserError(f"--tensor-split takes numbers separated by commas, e.g. 3,1; got {value!r}") from None


# options given as one string (or repeated) that settings hold as tuples, and flags that settings hold as words
_LISTS: dict[str, Callable[[Any], Any]] = {
    "stop": lambda value: tuple(value or ()),
    # `--rpc ""` stays a value, so that the settings refuse it instead of quietly running here
    "rpc": lambda value: tuple(p.strip() for p in value.split(",")) if value is not None else (),
    "tensor_split": _floats,
    "keep_history": lambda value: None if value is None else ("disk" if value else "memory"),
}


def build_options(**given: Any) -> Settings:
    """Settings from option values (any left out take their declared default), after a profile (``--profile``, or
    models.toml's ``default`` naming one) has filled what the user left out; validated."""
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"build_options: no option named {', '.join(sorted(unknown))}")
    values = DEFAULTS | given
    from localspec.models.registry import profile_options

    # a profile (or models.toml's `default` naming one) fills what the user left out
    for name, value in profile_options(values["profile"], values["model"]).items():
        if values[name] is None:
            values[name] = value
    if values["drafter"] is None:
        values["drafter"] = "auto"
    fields: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
    for o in OPTIONS:
        part, _, field = o.goes_to.partition(".")
        if field:
            value = values[o.name]
            fields[part][field] = _LISTS[o.name](value) if o.name in _LISTS else value
    settings = Settings(values["model"], **{part: cls(**fields[part]) for part, cls in _PARTS.items()})
    settings.validate()
    return settings


def generation_options(
    command_name: str, *, hide: tuple[str, ...] = (), **defaults: Any
) -> Callable[[Callable[..., Any]], Any]:
    """Give a command the options of :data:`OPTIONS` that it takes, validated into one ``options: Settings``
    argument (and, if the command has a ``given`` parameter, the raw values as typed).

    ``defaults`` changes an option's default for this command; ``hide`` leaves an option out (it keeps its default).
    """
    mine = [o for o in OPTIONS if command_name in o.commands]

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        params = inspect.signature(command, eval_str=True).parameters
        own = [p for p in params.values() if p.name not in ("options", "given")]
        shown = [o for o in mine if o.name not in hide]
        shared = [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(o.name, o.default),
                              annotation=o.annotation())
            for o in shown
        ]
        fixed = {o.name: defaults.get(o.name, o.default) for o in mine if o.name in hide}

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {o.name: kwargs.pop(o.name) for o in shown}
            from localspec.cli import user_errors

            with user_errors():
                options = build_options(**fixed, **values)
            if "given" in params:
                kwargs["given"] = values
            return command(options=options, **kwargs)

        run.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
        return run

    return wrap
