"""Generation settings: plain dataclasses with defaults and validation shared by every face."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from localspec.endpoints import parse_endpoints
from localspec.errors import UserError
from localspec.machine import usable_cores
from localspec.schema.spec import ConstraintSpec

DRAFTERS = ("none", "ngram", "draft", "early-exit", "layer-skip", "auto")
# those that need no model of their own: what a request to a server may ask for (``auto`` takes the server's draft
# model too, if it has one) and what a replay can draft with (``auto`` is n-gram lookup without a draft model)
MODEL_FREE_DRAFTERS = ("none", "ngram", "auto")
TEMPERATURE_MAX = 5.0
# a prediction's bound (OpenAI's Predicted Outputs): a file to edit. Each of its tokens costs work twice, when its
# place is looked for after an edit (a scan of the prediction) and when the usage counts what of it the answer holds
# (tokens.in_order); the characters are checked first, at 64 a token, so that no megabyte is tokenized to be refused
PREDICTION_MAX_TOKENS = 8192
PREDICTION_MAX_CHARS = 64 * PREDICTION_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """How a distribution is shaped and drawn from. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def reproducible(self) -> bool:
        """Sampled with a seed: the text must not depend on anything but the request, this machine and this build.
        llama.cpp's kernels give a position other logits in passes of other sizes, so such a request's pass sizes
        are priced on the measured pass costs alone, not on live timings, and its drafts come from its own text, not
        from what earlier runs wrote (runtime.py). Greedy needs none of it: it draws nothing."""
        return self.seed is not None and not self.greedy

    def validate(self) -> None:
        if not (0.0 <= self.temperature <= TEMPERATURE_MAX):
            raise UserError(f"--temperature must be between 0 and {TEMPERATURE_MAX:g} (0 = greedy), "
                            f"got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"--top-k must be 0 (off) or a positive number, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise UserError(f"--top-p must be in (0, 1] (1 = off), got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise UserError(f"--min-p must be in [0, 1) (0 = off), got {self.min_p}")
        if self.seed is not None and self.seed < 0:
            raise UserError(f"--seed must be a non-negative integer, got {self.seed}")


def default_gpu_layers() -> int:
    """-1 (all layers) where this llama-cpp-python can offload to a GPU, 0 elsewhere. Loads llama_cpp, so it is
    called when settings are built, never for --help."""
    from localspec.engine.backend import gpu_offload_supported

    return -1 if gpu_offload_supported() else 0


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """How llama.cpp runs the model: context size, threads, GPU offload."""

    n_ctx: int = 4096
    n_threads: int | None = None  # None: one per physical core (what llama-bench uses)
    # None: all layers where this llama.cpp can offload to a GPU, else 0; resolved when the settings are built,
    # so it is an int afterwards (-1 = all)
    n_gpu_layers: int | None = None
    n_batch: int = 512
    verbose: bool = False
    # RPC servers (HOST:PORT) the target's layers go to instead of a local GPU (engine/rpc.py); the draft stays local
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()  # each server's share of the layers (empty: llama.cpp's, by free memory)

    def __post_init__(self) -> None:
        if self.n_gpu_layers is None:
            # with RPC servers, "offloaded" means on them: all layers, unless --gpu-layers keeps some here
            object.__setattr__(self, "n_gpu_layers", -1 if self.rpc else default_gpu_layers())

    def threads(self) -> int:
        if self.n_threads:
            return self.n_threads
        return usable_cores()

    def validate(self) -> None:
        if self.n_ctx < 16:
            raise UserError(f"--ctx must be at least 16 tokens, got {self.n_ctx}")
        if self.n_threads is not None and self.n_threads < 1:
            raise UserError(f"--threads must be at least 1, got {self.n_threads}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise UserError(f"--gpu-layers must be -1 (all), 0 (CPU) or a count, got {self.n_gpu_layers}")
        if self.rpc:
            parse_endpoints(list(self.rpc))
        if self.tensor_split and (len(self.tensor_split) != len(self.rpc) or min(self.tensor_split) < 0
                                  or not sum(self.tensor_split)):
            raise UserError(f"--tensor-split takes one share per --rpc server ({len(self.rpc)}), each >= 0, "
                            f"got {','.join(f'{x:g}' for x in self.tensor_split)}")


# trees are opt-in: replayed on the shipped cost tables they paid on no prompt of ours (docs/performance.md)
BRANCHES_DEFAULT = 1
BRANCHES_MAX = 8


@dataclass(frozen=True, slots=True)
class SpeculationSettings:
    """Which drafter proposes tokens and how many. k None: adaptive. ``branches``: the most candidates a lookup
    offers, verified together as a token tree (the policy picks how many pay; 1: always one chain)."""

    drafter: str = "auto"
    draft_model: str | None = None
    k: int | None = None
    k_max: int = 16
    exit_layer: int | None = None
    skip_layers: str | None = None  # blocks a layer-skip draft leaves out ("8-19"); checked against the model
    p_min: float = 0.0
    branches: int = BRANCHES_DEFAULT  # the most candidates verified together as a token tree (1: one chain)

    def validate(self) -> None:
        if not (1 <= self.branches <= BRANCHES_MAX):
            raise UserError(f"--branches must be between 1 (one chain) and {BRANCHES_MAX}, got {self.branches}")
        if self.drafter not in DRAFTERS:
            raise UserError(f"unknown drafter {self.drafter!r}: choose one of {', '.join(DRAFTERS)}")
        if self.k is not None and not (0 <= self.k <= self.k_max):
            raise UserError(f"--k must be between 0 and {self.k_max} (omit it for adaptive), got {self.k}")
        if self.drafter == "draft" and not self.draft_model:
            raise UserError("--drafter draft needs a draft model: pass --draft NAME|PATH (or use a --profile)")
        if self.exit_layer is not None and self.exit_layer < 1:
            raise UserError(f"--exit-layer must be at least 1, got {self.exit_layer}")
        if self.skip_layers is not None:
            if self.drafter != "layer-skip":
                raise UserError("--skip-layers is for --drafter layer-skip")
            parse_blocks(self.skip_layers)  # its form now, before a model loads; its range once one has
        if not (0.0 <= self.p_min < 1.0):
            raise UserError(f"--p-min must be in [0, 1), got {self.p_min}")


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """One request's limits. ``max_tokens_cap``: the most a request may ask for (a server's bound on what one
    client can hold a sequence for; None: the context bounds it)."""

    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    max_tokens_cap: int | None = None
    # what the answer must match (a JSON schema, a grammar, a regex); None: free text
    constraint: ConstraintSpec | None = None
    # what the answer will mostly be, as token ids (OpenAI's Predicted Outputs): drafted from, never imposed
    prediction: tuple[int, ...] = ()

    def validate(self) -> None:
        if self.constraint is not None:
            self.constraint.grammar()  # compiles and checks it: a bad schema is an error before the model loads
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be a positive number, got {self.max_tokens}")
        if self.max_tokens_cap is not None and self.max_tokens_cap < 1:
            raise UserError(f"--max-tokens-cap must be a positive number, got {self.max_tokens_cap}")
        if self.max_tokens_cap is not None and self.max_tokens > self.max_tokens_cap:
            raise UserError(f"--max-tokens {self.max_tokens} is over --max-tokens-cap {self.max_tokens_cap}: "
                            "lower the default or raise the cap")
        if any(s == "" for s in self.stop):
            raise UserError("--stop must not be empty")


HISTORY_MODES = ("disk", "memory", "off")
HISTORY_ENV = "LOCALSPEC_HISTORY"  # the setting: disk | memory | off, over each face's default
HISTORY_MAX_TOKENS = 1_000_000


def _lower(a: str, b: str) -> str:
    """The less lasting of two history modes (off < memory < disk)."""
    return a if HISTORY_MODES.index(a) >= HISTORY_MODES.index(b) else b


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """Drafts from earlier requests (localspec/history): ``mode`` "disk" keeps them across runs in the cache folder,
    "memory" for this process only, "off" not at all; None: the face's default (disk for run, chat, batch and the
    Python API: the user's own text; memory for serve: other people's), lowered by ``LOCALSPEC_HISTORY`` if set.
    The variable never raises it: a server keeps other people's text on disk only when its operator says so
    (``serve --keep-history``), not because of a variable set for one's own runs."""

    mode: str | None = None
    max_tokens: int = HISTORY_MAX_TOKENS  # over all scopes; the oldest requests go first

    def resolved(self, default: str) -> str:
        if self.mode is not None:
            return self.mode
        env = os.environ.get(HISTORY_ENV, "").strip().lower()
        if env not in HISTORY_MODES:
            return default
        return _lower(env, default)

    def validate(self) -> None:
        if self.mode is not None and self.mode not in HISTORY_MODES:
            raise UserError(f"the history mode must be one of {', '.join(HISTORY_MODES)}, got {self.mode!r}")
        env = os.environ.get(HISTORY_ENV, "").strip().lower()
        if env and env not in HISTORY_MODES:
            raise UserError(f"{HISTORY_ENV} must be one of {', '.join(HISTORY_MODES)}, got {env!r}")
        if self.max_tokens < 0:
            raise UserError(f"the history's bound must be 0 or more tokens, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one face (run, chat, bench) needs to open a runtime and generate: the model (a name or path;
    None: the default) and each part's settings."""

    model: str | None = None
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    history: HistorySettings = field(default_factory=HistorySettings)

    def validate(self) -> None:
        for part in (self.runtime, self.speculation, self.sampling, self.generation, self.history):
            part.validate()


def parse_blocks(spec: str) -> set[int]:
    """Block numbers and ranges ("8-19", "4,6-9"), numbered from 0: UserError where it is not that."""
    skipped: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UserError(f"--skip-layers takes block numbers and ranges like 8-19 or 4,6-9, not {spec!r}")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if lo > hi:
            raise UserError(f"--skip-layers: the range {part} runs backwards")
        skipped.update(range(lo, hi + 1))
    return skipped
