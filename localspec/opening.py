"""What every runtime opens first: the target model, its prompts (plain, chat, tools), the lookup drafters and the
history of earlier requests. runtime.py's Runtime (one sequence) and BatchRuntime (lanes) both start here."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec._native import has_gpu_backend
from localspec.drafters.base import Drafter
from localspec.drafters.early_exit import check_exit_layer, default_exit_layer, early_exit_model
from localspec.drafters.layer_skip import Subset, default_skip, layer_skip_model
from localspec.drafters.model import ModelDrafter, check_compatible
from localspec.drafters.ngram import NgramDrafter
from localspec.engine import ChatTemplate, Context, Device, Message, Model
from localspec.engine.backend import gpu_offload_supported
from localspec.engine.lanes import Lanes
from localspec.engine.model import check_file
from localspec.errors import ContextFullError, UserError
from localspec.history import History, HistoryView
from localspec.models.files import known_sha256
from localspec.models.files import say as to_stderr
from localspec.sampling import make_rng
from localspec.schema import ConstraintSpec
from localspec.settings import (
    PREDICTION_MAX_CHARS,
    PREDICTION_MAX_TOKENS,
    RuntimeSettings,
    SamplingSettings,
    Settings,
    SpeculationSettings,
)
from localspec.speculative.calibrate import Reads, choose_reads, load_or_measure
from localspec.speculative.calibration_cache import Calibration
from localspec.speculative.draft_phase import DraftPhase
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.shape_timing import load_or_measure_shapes
from localspec.speculative.shapes import Shapes
from localspec.structured.grammars import Grammars
from localspec.structured.tool_prompt import plain_conversation, tool_calls, tool_prompt
from localspec.structured.tools import Calls, ToolUse

NO_GPU_OFFLOAD = "this llama-cpp-python was built without GPU offload: running on the CPU; see README 'GPU'"
NO_GPU_DEVICE = "llama.cpp found no GPU it can use (a GPU build, but no device or driver): running on the CPU"

def resolve(spec: str | None) -> tuple[str, Path]:
    """A model name from models.toml, or a path, → (display name, file)."""
    from localspec.models.sources import resolve_model

    resolved = resolve_model(spec)
    return resolved.name, resolved.path


class Prompts:
    """Turning text into the target's prompt tokens: what every runtime offers its faces."""

    model: Model
    chat_template: ChatTemplate
    grammars: Grammars | None

    def prompt_tokens(self, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """A plain prompt may name special tokens ("<start_of_turn>"), as in llama.cpp; a chat message may not."""
        if chat:
            tokens = self.chat_tokens(([Message("system", system)] if system else []) + [Message("user", prompt)])
        else:
            tokens = self.model.vocab.tokenize(prompt, add_special=True, parse_special=True)
        if not tokens:
            raise UserError("the prompt is empty: pass some text (or - to read it from stdin)")
        return tokens

    def chat_tokens(self, messages: list[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """A conversation in the chat template, ready for the model's answer; the messages' text stays text.
        ``tools``: OpenAI tool dicts, shown to the model as its template shows them."""
        if tools is None and getattr(self.chat_template, "jinja", None) is None \
                and any(m.tool_calls or m.role == "tool" for m in messages):
            messages = plain_conversation(messages)  # earlier calls and results, as text its template can show
        return self.chat_template.tokenize(self.model.vocab, messages, add_assistant=True, tools=tools)

    def prediction_tokens(self, text: str | None) -> tuple[int, ...]:
        """A prediction's tokens, as the answer would hold its text (no special tokens parsed); UserError past
        PREDICTION_MAX_TOKENS (its characters are counted first: no megabyte is tokenized to be refused)."""
        if not text:
            return ()
        if len(text) > PREDICTION_MAX_CHARS:
            raise UserError(f"the prediction has {len(text)} characters, more than a prediction of at most "
                            f"{PREDICTION_MAX_TOKENS} tokens can: send the part of the file the answer will copy")
        tokens = self.model.vocab.tokenize(text, add_special=False, parse_special=False)
        if len(tokens) > PREDICTION_MAX_TOKENS:
            raise UserError(f"the prediction is {len(tokens)} tokens, more than {PREDICTION_MAX_TOKENS}: send the part "
                            "of the file the answer will copy")
        return tuple(tokens)

    def tool_prompt(self, messages: list[Message], use: ToolUse) -> tuple[list[int], ConstraintSpec | None]:
        """A conversation with tools: its tokens, and the constraint of the answer's calls (structured/)."""
        return tool_prompt(self.chat_template, self.model.vocab, messages, use)

    def tool_calls(self, text: str, use: ToolUse, ids: tuple[str, ...] = ()) -> Calls:
        """The tool calls in an answer, each valid for its tool; none where the answer is text. ``ids``: the calls'
        ids where a stream already gave them."""
        return tool_calls(self.grammars, text, use, ids)


@dataclass
class Checks(Prompts):
    """What a face checks once the model is loaded and before anything is measured, drafted with or compiled: its
    prompts' tokens against the context (``n_ctx``: the most a sequence can hold), a prediction's bound. A bad input
    is then its one line within a second of the load, in a fresh home as in a warm one."""

    model: Model
    chat_template: ChatTemplate
    n_ctx: int
    grammars: Grammars | None = None

    def fits(self, tokens: Sequence[int]) -> None:
        if len(tokens) >= self.n_ctx:
            raise ContextFullError.prompt(len(tokens), self.n_ctx)


Check = Callable[[Checks], None]


def never() -> bool:
    return False


def open_target(
    settings: Settings, stack: ExitStack, cancelled: Callable[[], bool] | None
) -> tuple[str, Path, Model, list[str]]:
    """The target model, loaded into ``stack``: its name, file, Model, and what the user should know about it."""
    runtime = settings.runtime
    name, path = resolve(settings.model)
    draft = settings.speculation.draft_model
    if draft and settings.speculation.drafter in ("draft", "auto"):
        check_file(resolve(draft)[1])  # a missing or non-GGUF draft is said before the target loads
    notices: list[str] = []
    if runtime.n_gpu_layers and not runtime.rpc and not gpu_offload_supported():  # llama.cpp would use the CPU
        notices.append(NO_GPU_DEVICE if has_gpu_backend() else NO_GPU_OFFLOAD)
    if not runtime.rpc:
        model = stack.enter_context(Model(path, n_gpu_layers=runtime.n_gpu_layers, verbose=runtime.verbose,
                                          cancelled=cancelled))
        return name, path, model, notices
    from localspec.endpoints import parse_endpoints
    from localspec.engine import rpc, rpc_watch

    # checked and registered before llama.cpp sees them: it aborts on a server it cannot reach
    endpoints = parse_endpoints(list(runtime.rpc))
    rpc_watch.limits()  # a bad value is one line now, not after the layers went over the network
    devices = rpc.devices(endpoints)
    with rpc.sending(f"{path.name}'s layers"):
        model = stack.enter_context(
            Model(path, n_gpu_layers=runtime.n_gpu_layers, verbose=runtime.verbose, cancelled=cancelled,
                  devices=devices, tensor_split=runtime.tensor_split, remote=",".join(runtime.rpc))
        )
    rpc_watch.watch_connections(endpoints)
    return name, path, model, notices


@dataclass
class Opening:
    """What ``Runtime.open`` and ``BatchRuntime.open`` both do with their target, in the order they do it: the
    model loaded (``opening``), this device's figures for it measured or read on a context the runtime chooses (its
    own, or a probe), the context's size said where it is not what was asked, and the history opened. Everything
    opened goes on ``stack``, which the runtime keeps."""

    settings: Settings
    name: str
    path: Path
    model: Model
    device: Device
    stack: ExitStack
    notices: list[str] = field(default_factory=list)
    say: Callable[[str], None] | None = None
    cancelled: Callable[[], bool] | None = None

    @property
    def sha256(self) -> str:
        return known_sha256(self.path)

    def reads(self, ctx: Context, rows: int, *, settle: bool = False) -> Reads | None:
        """How greedy passes of up to ``rows`` rows are read back on this device (token ids or logits), and the
        context set to read them so (calibrate.choose_reads)."""
        return choose_reads(ctx, self.sha256, self.device, rows, say=self.say, cancelled=self.cancelled,
                            settle=settle)

    def shapes(self, ctx: Context, rows: int) -> Shapes:
        """The pass sizes this device keeps, up to ``rows`` (none on a CPU)."""
        return load_or_measure_shapes(ctx, self.sha256, self.device, rows, say=self.say, cancelled=self.cancelled)

    def pass_costs(self, ctx: Context, rows: int, *, retry: bool = True) -> Calibration:
        """What a pass of 1..``rows`` rows costs here (calibrate.load_or_measure)."""
        return load_or_measure(ctx, self.sha256, self.device, rows, say=self.say, cancelled=self.cancelled,
                               retry=retry)

    def context_size(self, got: int, *, per_sequence: bool = False) -> None:
        """Say where the context holds other than the ``--ctx`` asked for."""
        asked = self.settings.runtime.n_ctx
        if got == asked or (per_sequence and got > asked):
            return
        why = (f"{self.name} was trained on {self.model.n_ctx_train}" if got < asked
               else "llama.cpp sizes contexts in steps of 256")
        self.notices.append(f"--ctx {asked} is {got} tokens{' per sequence' if per_sequence else ''} here ({why})")

    def history(self, default: str) -> History | None:
        return open_history(self.settings, self.path, default, self.notices, self.model.vocab.n_tokens)

    def check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled():  # Ctrl-C after the loads, e.g. while measuring
            raise KeyboardInterrupt


@contextmanager
def opening(settings: Settings, cancelled: Callable[[], bool] | None = None,
            say: Callable[[str], None] | None = None) -> Iterator[Opening]:
    """The target loaded, with what a runtime opens next; on any failure (Ctrl-C included) all of it is closed."""
    stack = ExitStack()
    try:
        name, path, model, notices = open_target(settings, stack, cancelled)
        check_self_draft(settings.speculation, model)
        check_draft_tokenizer(settings.speculation, model)
        yield Opening(settings, name, path, model, Device.of(model, settings.runtime.threads()), stack, notices, say,
                      cancelled)
    except BaseException:
        stack.close()
        raise


def check_self_draft(speculation: SpeculationSettings, target: Model) -> None:
    """A draft made of the target's own blocks names blocks this model has: said once it is loaded, before anything
    is measured or built."""
    if speculation.drafter == "early-exit":
        check_exit_layer(speculation.exit_layer or default_exit_layer(target.n_layer), target.n_layer)
    elif speculation.drafter == "layer-skip":
        Subset.parse(speculation.skip_layers or default_skip(target.n_layer), target.n_layer)


def check_draft_tokenizer(speculation: SpeculationSettings, target: Model) -> None:
    """A draft model's tokenizer is the target's: checked on its vocabulary alone, before anything is measured (the
    draft itself loads after the target's pass costs)."""
    if speculation.draft_model and speculation.drafter in ("draft", "auto"):
        with Model(resolve(speculation.draft_model)[1], vocab_only=True) as draft:
            check_compatible(target, draft)


def lookup_drafters(kind: str, history: HistoryView | None = None) -> list[Drafter] | None:
    """The drafters of ``kind`` that need no model, in the order the loop asks them; None if ``kind`` needs one
    (``auto`` without a draft model is n-gram lookup alone). ``history``: earlier requests the lookup searches too."""
    if kind == "none":
        return []
    return [NgramDrafter(history=history)] if kind in ("ngram", "auto") else None


def drafts_from(view: HistoryView | None, sampling: SamplingSettings) -> HistoryView | None:
    """The history a lookup drafts from: none for a seeded sampled request, whose drafts (and so pass sizes, which
    move llama.cpp's logits) must not follow what the runs before it wrote; it still feeds the history."""
    return None if sampling.reproducible else view


def open_history(
    settings: Settings, path: Path, default: str, notices: list[str], n_vocab: int | None = None,
) -> History | None:
    """The model's history as the settings want it (``default``: the face's): on disk in the cache folder, in
    memory, or None (off); a file that could not be used adds its one-line notice."""
    mode = settings.history.resolved(default)
    if mode == "off":
        return None
    from localspec.history.disk import history_path

    sha = known_sha256(path)
    history = History.open(sha, history_path(sha) if mode == "disk" else None, settings.history.max_tokens, n_vocab)
    notices.extend(history.notices)
    history.notices.clear()
    return history


def save_history(history: History | None, say: Callable[[str], None] | None = None) -> bool:
    """Save ``history`` where it is kept on disk; whatever went wrong (a full disk, a folder made read-only) is
    said in one line (``say``, else stderr), never dropped: the user would think the requests kept."""
    if history is None:
        return True
    saved = history.save()
    for notice in history.notices:
        (say or to_stderr)(notice)
    history.notices.clear()
    return saved


def model_draft(kind: str, speculation: SpeculationSettings, target: Model) -> tuple[Path, str] | None:
    """The GGUF a model drafter of ``kind`` drafts with, and the drafter's name; None where ``kind`` only looks
    things up (``auto`` without a draft model)."""
    if kind == "early-exit":
        layer = speculation.exit_layer or default_exit_layer(target.n_layer)
        return early_exit_model(target.path, layer, target.n_layer), "early-exit"
    if kind == "layer-skip":
        subset = Subset.parse(speculation.skip_layers or default_skip(target.n_layer), target.n_layer)
        return layer_skip_model(target.path, subset), "layer-skip"
    # ``auto`` never picks layer-skip: measured, no subset paid on this CPU (docs/performance.md)
    if kind == "draft" or (kind == "auto" and speculation.draft_model):
        return resolve(speculation.draft_model)[1], "draft"
    return None


def open_draft_model(
    path: Path, target: Model, runtime: RuntimeSettings, stack: ExitStack, cancelled: Callable[[], bool] | None,
) -> Model:
    draft = stack.enter_context(
        Model(path, n_gpu_layers=runtime.n_gpu_layers, verbose=runtime.verbose, cancelled=cancelled)
    )
    check_compatible(target, draft)
    return draft


def open_draft_phase(
    path: Path, name: str, target: Model, parallel: int, n_max: int, runtime: RuntimeSettings, stack: ExitStack, *,
    priced: bool = True, say: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
    retry: bool = True,
) -> DraftPhase:
    """A batch's draft model: a lane per target lane, and what a drafted token costs a lane that drafts alone (one
    row a decode: every lane waits for the phase), measured once per machine on a probe context as the target's pass
    costs are (not where k is pinned: ``priced``); the lanes' shares of the phases they draft in correct it."""
    draft = open_draft_model(path, target, runtime, stack, cancelled)
    token_seconds = 0.0
    if priced:
        with Context(draft, n_ctx=256, n_threads=runtime.threads(), n_batch=runtime.n_batch,
                     greedy_rows=n_max) as probe:
            probe.use_backend_sampler(False)  # priced as the phase reads its rows: logits
            costs = load_or_measure(probe, known_sha256(path), Device.of(draft, runtime.threads()), n_max, say=say,
                                    cancelled=cancelled, retry=retry)
        token_seconds = costs.seconds[1]
    lanes = stack.enter_context(Lanes(draft, parallel, n_ctx=runtime.n_ctx, n_threads=runtime.threads(),
                                      n_batch=runtime.n_batch, max_rows=parallel))
    lanes.context.use_backend_sampler(False)  # drafts read logits: q for sampled lanes, p_min for all
    return DraftPhase(lanes, name=name, token_seconds=token_seconds)


def open_drafters(
    kind: str,
    target: Model,
    speculation: SpeculationSettings,
    sampling: SamplingSettings,
    runtime: RuntimeSettings,
    policy: DraftPolicy,
    stack: ExitStack,
    cancelled: Callable[[], bool] | None = None,
    say: Callable[[str], None] | None = None,
    history: HistoryView | None = None,
) -> list[Drafter]:
    """The drafters for ``--drafter kind``; ``auto`` is a cascade: n-gram lookup, then the draft model if any."""
    drafted = model_draft(kind, speculation, target)
    if drafted is None:
        drafters = lookup_drafters(kind, history)
        if drafters is None:
            raise UserError(f"unknown drafter {kind!r}")
        return drafters
    path, name = drafted
    draft = open_draft_model(path, target, runtime, stack, cancelled)
    ctx = stack.enter_context(Context(draft, n_ctx=runtime.n_ctx, n_threads=runtime.threads(), n_batch=runtime.n_batch))
    if speculation.k is None:  # the policy should know what a drafted token costs before trying
        costs = load_or_measure(ctx, known_sha256(path), Device.of(draft, runtime.threads()), 1, say=say,
                                cancelled=cancelled, retry=not sampling.reproducible)
        policy.calibrate_drafter(name, costs.seconds[1])
    rng = make_rng(None if sampling.seed is None else sampling.seed + 1)
    model = ModelDrafter(ctx, sampling, rng, name=name, p_min=speculation.p_min, owns_model=False)
    return [NgramDrafter(history=history), model] if kind == "auto" else [model]
