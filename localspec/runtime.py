"""Opens what a generation needs from settings: target model and context, drafter, generator.

The one place where settings become live llama.cpp objects; run, chat and bench all start here, and
everything opened is closed in reverse order when the runtime is closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localspec.drafters.base import Drafter
from localspec.engine import ChatTemplate, Context, Device, Model
from localspec.engine.lanes import Lanes
from localspec.errors import UserError
from localspec.events import Event
from localspec.history import LOCAL_SCOPE, History, HistoryView
from localspec.models.files import known_sha256
from localspec.opening import (
    Check,
    Checks,
    Prompts,
    drafts_from,
    lookup_drafters,
    model_draft,
    never,
    open_draft_phase,
    open_drafters,
    opening,
    save_history,
)
from localspec.request import Request
from localspec.sampling import make_rng
from localspec.settings import (
    GenerationSettings,
    SamplingSettings,
    Settings,
)
from localspec.speculative.calibrate import Reads, load_or_measure
from localspec.speculative.calibration_cache import Calibration
from localspec.speculative.costs import PARALLEL_AUTO_MAX, PassCosts, auto_parallel
from localspec.speculative.draft_phase import DraftPhase, LaneDrafter
from localspec.speculative.jobs import Job
from localspec.speculative.loop import Generator, Target
from localspec.speculative.policy import DraftPolicy
from localspec.speculative.shapes import Shapes
from localspec.speculative.survival import Survival
from localspec.structured.grammars import Grammars

if TYPE_CHECKING:
    import numpy as np

    from localspec.speculative.noise import Noise

# --branches N on a device with CUDA graphs (speculative/policy.py, ``width``)
TREES_OFF = ("token trees (--branches) are off on this device: its CUDA graphs want every pass the same size, and "
             "a tree changes it; drafts are verified as chains of the sizes it keeps")


@dataclass
class Runtime(Prompts):
    model_name: str
    model: Model
    context: Context
    generator: Generator
    drafter_name: str
    chat_template: ChatTemplate
    settings: Settings
    device: Device  # where the target runs, read once when it opens
    notices: list[str] = field(default_factory=list)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _drafters: dict[str, list[Drafter]] = field(default_factory=dict, repr=False)
    # the target's pass costs as measured on this device; live passes correct it, and the runtime writes what they
    # improved back when it closes
    calibration: Calibration | None = None
    reads: Reads | None = None  # how greedy passes are read back here (token ids or logits), and why
    say: Callable[[str], None] | None = field(default=None, repr=False)
    # earlier requests' tokens, which the lookup drafts from too (None: --history off); fed as each generation ends
    history: History | None = None
    grammars: Grammars | None = field(default=None, repr=False)  # the model's (structured output), the generator's

    @classmethod
    def open(
        cls, settings: Settings, *, cancelled: Callable[[], bool] | None = None,
        say: Callable[[str], None] | None = None, history_default: str = "disk", check: Check | None = None,
    ) -> Runtime:
        """``cancelled``: polled while models load and measure (a Ctrl-C flag); when it turns true,
        KeyboardInterrupt. ``say``: what the first start measures, and for how long (stderr when not given).
        ``history_default``: where earlier requests are kept unless the settings say (disk, memory, off).
        ``check``: the face's checks that need the model (its prompt's tokens), run before anything is measured."""
        runtime, speculation, sampling = settings.runtime, settings.speculation, settings.sampling
        with opening(settings, cancelled, say) as o:
            target, notices = o.model, o.notices
            # greedy: verify through llama.cpp's backend sampler (token ids, no logits copied) where it has one
            greedy_rows = speculation.k_max + 1 if sampling.greedy else 0
            # trees need a sequence per branch; the context is made for them even while the drafter needs none, so
            # the chat can switch drafters without a new context
            ctx = o.stack.enter_context(Context(target, n_ctx=runtime.n_ctx, n_threads=runtime.threads(),
                                                n_batch=runtime.n_batch, greedy_rows=greedy_rows,
                                                n_seq=speculation.branches))
            template = ChatTemplate.for_model(target)
            if check is not None:
                check(Checks(target, template, ctx.n_ctx))
            # token ids from the backend sampler, or logits: whichever this device reads a pass back faster
            reads = o.reads(ctx, greedy_rows)
            o.context_size(ctx.n_ctx)
            shapes = o.shapes(ctx, speculation.k_max + 1)
            policy = DraftPolicy(k_max=speculation.k_max, fixed=speculation.k, branches=speculation.branches,
                                 shapes=shapes, reproducible=sampling.reproducible)
            if speculation.branches > 1 and shapes.active:
                notices.append(TREES_OFF)
            drafter_name = speculation.drafter
            if drafter_name != "none" and not target.can_rollback:
                notices.append(f"{o.name} cannot roll back its cache: speculation is off, decoding plainly")
                drafter_name = "none"
            history = o.history(history_default)
            view = history.view(LOCAL_SCOPE) if history is not None else None
            drafters = open_drafters(drafter_name, target, speculation, sampling, runtime, policy, o.stack,
                                      cancelled, say, drafts_from(view, sampling))
            generator = Generator(ctx, target.vocab, drafters, sampling, policy)
            grammars = generator.grammars = Grammars(target.vocab, say, target.path)
            if view is not None:
                generator.on_end = view.feed
            rt = cls(o.name, target, ctx, generator, drafter_name, template, settings, o.device, notices, o.stack,
                     say=say, history=history)
            rt._drafters[drafter_name] = drafters
            rt.reads = reads
            rt.grammars = grammars
            if drafters:
                rt._calibrate(cancelled)
            o.check_cancelled()
            return rt

    # -- the façade: what run, chat, bench and the scripts ask of a runtime, so that none reaches into its parts --

    def generate(
        self, tokens: Sequence[int], generation: GenerationSettings | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """Generate after ``tokens`` with the current drafter: Prefill, Steps, Finished (see events.py)."""
        return self.generator.generate(tokens, generation or self.settings.generation, cancelled or never)

    def fresh(self, *, k: int | None = None, branches: int | None = None, clear_cache: bool = False) -> None:
        """Forget what earlier generations taught the policy about the text (the device's pass costs stay), pin
        the draft length and tree width for what follows (None: the runtime's own settings), and with
        ``clear_cache`` empty the KV cache so the next prompt is prefilled from scratch."""
        policy, speculation = self.generator.policy, self.settings.speculation
        policy.reset()
        policy.fixed = speculation.k if k is None else k
        policy.branches = speculation.branches if branches is None else branches
        if clear_cache:
            self.context.clear()

    def plain_seconds_per_token(self) -> float:
        """What one token costs without speculation here, as the policy measured it (0: not yet)."""
        return self.generator.policy.plain_seconds_per_token()

    def score(self, tokens: Sequence[int], *, one_by_one_from: int | None = None) -> np.ndarray:
        """The target's logits after ``tokens``, from an empty cache (left empty again): a probe, not a
        generation. ``one_by_one_from``: the tokens from there on decoded 1 row a pass, as target-only decoding
        went (else all in one prefill)."""
        ctx = self.context
        ctx.clear()
        try:
            split = len(tokens) if one_by_one_from is None else max(1, min(one_by_one_from, len(tokens)))
            row = ctx.decode(list(tokens[:split]))[-1]
            for t in tokens[split:]:
                row = ctx.decode([t])[-1]
            return row.copy()
        finally:
            ctx.clear()

    def noise(self, cancelled: Callable[[], bool] | None = None) -> Noise:
        """How far this device's logits move with a pass's size: the near-tie margin of the lossless check
        (measured once per model and device, then cached)."""
        from localspec.speculative.noise import PROMPTS, load_or_measure_noise

        return load_or_measure_noise(self.context, known_sha256(self.model.path), self.device,
                                     [self.prompt_tokens(p) for p in PROMPTS], say=self.say, cancelled=cancelled)

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx

    def tag_history(self, tag: int) -> None:
        """What the next generations feed the history is ``tag``'s (a chat's conversation id), so that deleting the
        conversation can forget it (``History.forget``); 0: nobody's in particular."""
        on_end = self.generator.on_end
        view = getattr(on_end, "__self__", None)  # the view whose feed the generator calls (Runtime.open)
        if isinstance(view, HistoryView):
            view.tag = tag

    def set_drafter(self, kind: str) -> None:
        """Switch the drafter for the next generation, opening it on first use (it then stays open)."""
        if kind not in self._drafters:
            runtime, speculation, sampling = self.settings.runtime, self.settings.speculation, self.settings.sampling
            if kind != "none" and not self.model.can_rollback:
                raise UserError(f"{self.model_name} cannot roll back its cache: only --drafter none works")
            view = self.history.view(LOCAL_SCOPE) if self.history is not None else None
            self._drafters[kind] = open_drafters(
                kind, self.model, speculation, sampling, runtime, self.generator.policy, self._stack,
                history=drafts_from(view, sampling)
            )
        if self._drafters[kind]:
            self._calibrate()
        self.generator.drafters = self._drafters[kind]
        self.drafter_name = kind

    def _calibrate(self, cancelled: Callable[[], bool] | None = None) -> None:
        policy, speculation = self.generator.policy, self.settings.speculation
        # a fixed k needs no cost model where every pass is the size it asks for (a CPU); where the device keeps
        # pass sizes, a pinned k still chooses between 1 row and its padded size, and uncalibrated costs grow with
        # the rows: 1 row always won, and a pinned k never drafted on a GPU
        if policy.calibrated or (speculation.k is not None and not policy.shapes.active):
            return
        # a seeded sampled request prices on the figures as measured, and takes a disturbed measurement as it is
        # rather than measuring again at each start: either would change its pass sizes from one run to the next
        reproducible = self.settings.sampling.reproducible
        self.calibration = load_or_measure(
            self.context, known_sha256(self.model.path), self.device, speculation.k_max + 1, say=self.say,
            cancelled=cancelled, retry=not reproducible,
        )
        policy.calibrate(self.calibration.as_measured if reproducible else self.calibration.seconds)

    def save_pass_costs(self) -> list[int]:
        """Write back the pass costs that live passes proved lower than the calibration's; the sizes changed."""
        if self.calibration is None:
            return []
        changed = self.calibration.improve(self.generator.policy.costs)
        if changed and not self.calibration.save():
            return []  # a read-only cache costs only the correction
        return changed

    def close(self) -> None:
        try:
            self.save_pass_costs()
            save_history(self.history, self.say)
        finally:
            self._stack.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class BatchRuntime(Prompts):
    """What ``localspec batch`` and ``generate_many`` run on: the target on ``parallel`` lanes of one context, the
    pass costs its sequences share, a factory for each sequence's loop, and a draft model's lanes where it drafts with
    one (their drafts come from the scheduler's draft phase, all lanes at once)."""

    model_name: str
    model: Model
    lanes: Lanes
    costs: PassCosts
    chat_template: ChatTemplate
    settings: Settings
    parallel: int
    device: Device  # where the target runs, read once when it opens
    notices: list[str] = field(default_factory=list)
    calibration: Calibration | None = None
    shapes: Shapes = field(default_factory=Shapes)  # the pass sizes this device keeps (a GPU's CUDA graphs)
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    history: History | None = None  # earlier requests' tokens, per scope (None: off)
    # what earlier requests' drafts are worth, learned across the job's sequences as one sequence's generations learn
    # it, per scope (DraftPolicy.shared; each sequence learns its own text's kinds alone)
    trust: dict[str, dict[str, Survival]] = field(default_factory=dict, repr=False)
    say: Callable[[str], None] | None = field(default=None, repr=False)  # where a failed save is said (else stderr)
    grammars: Grammars | None = field(default=None, repr=False)  # the model's, built on the first constrained job
    # what seeded sampled sequences price on: the calibration as measured, never corrected live (PassCosts.frozen)
    measured_costs: PassCosts = field(default_factory=PassCosts, repr=False)
    drafts: DraftPhase | None = None  # the draft model's lanes, where the runtime drafts with one

    def __post_init__(self) -> None:
        self.grammars = Grammars(self.model.vocab, self.say, self.model.path)

    @classmethod
    def open(
        cls, settings: Settings, parallel: int | None = None, *, jobs: int | None = None,
        cancelled: Callable[[], bool] | None = None, say: Callable[[str], None] | None = None,
        history_default: str = "disk", seeded: bool = False,
        check: Callable[[Checks], Admitted | None] | None = None,
    ) -> BatchRuntime:
        """``parallel`` None: as many lanes as pay on this device's pass costs (at most PARALLEL_AUTO_MAX, and no
        more than ``jobs``). ``history_default``: as Runtime.open's (serve passes "memory"). ``seeded``: every
        request will carry a seed of its own (``seeded_job``), so the job keeps a seeded job's promise as if it
        had one (docs/speculation.md, "What a seed promises"). ``check``: as Runtime.open's, before anything is
        measured; its ``n_ctx`` is the most a sequence may hold here (the lanes' own is known once they are made,
        after the pass costs that decide how many there are), and what it admits (``Admitted``) replaces ``jobs``
        and ``seeded``."""
        runtime, speculation = settings.runtime, settings.speculation
        with opening(settings, cancelled, say) as o:
            target, notices = o.model, o.notices
            template = ChatTemplate.for_model(target)
            if check is not None:
                trained = target.n_ctx_train
                admitted = check(Checks(target, template, min(runtime.n_ctx, trained) if trained > 0
                                        else runtime.n_ctx))
                if admitted is not None:
                    jobs, seeded = admitted.jobs, admitted.seeded
            # a job seeded as a whole (--seed, or a seed on every line): its lanes too, see below
            reproducible = settings.sampling.reproducible or seeded
            n_max = speculation.k_max + 1
            # the pass costs decide how many lanes pay; measured (once per machine) on a context of one lane
            with Context(target, n_ctx=256, n_threads=runtime.threads(), n_batch=runtime.n_batch,
                         greedy_rows=n_max) as probe:
                reads = o.reads(probe, n_max, settle=reproducible)
                calibration = o.pass_costs(probe, n_max, retry=not reproducible)
                shapes = o.shapes(probe, runtime.n_batch)
            costs = PassCosts(dict(calibration.seconds), wide_slope=shapes.active)
            measured = PassCosts(dict(calibration.as_measured), wide_slope=shapes.active, frozen=True)
            if parallel is None:
                parallel = auto_parallel(measured if reproducible else costs, PARALLEL_AUTO_MAX)
            parallel = max(1, min(parallel, jobs or parallel))
            lanes = o.stack.enter_context(Lanes(
                target, parallel, n_ctx=runtime.n_ctx, n_threads=runtime.threads(), n_batch=runtime.n_batch,
                max_rows=min(runtime.n_batch, parallel * n_max)))
            if reads is not None and not reads.ids:
                lanes.context.use_backend_sampler(False)
            o.context_size(lanes.n_ctx, per_sequence=True)
            o.check_cancelled()
            drafts = None
            drafted = model_draft(speculation.drafter, speculation, target)
            if drafted is not None:
                drafts = open_draft_phase(*drafted, target, parallel, n_max, runtime, o.stack,
                                          priced=speculation.k is None, say=say, cancelled=cancelled,
                                          retry=not reproducible)
                if drafts.lanes.n_ctx < lanes.n_ctx:
                    notices.append(f"the draft model's sequences hold {drafts.lanes.n_ctx} tokens, the target's "
                                   f"{lanes.n_ctx}: past that, a sequence drafts without it")
            history = o.history(history_default)
            return cls(o.name, target, lanes, costs, template, settings, parallel, o.device,
                       notices, calibration, shapes, o.stack, history, say=say, measured_costs=measured, drafts=drafts)

    def make_generator(self, lane: Target, job: Job) -> Generator:
        """A sequence's own loop: fresh drafters and acceptance statistics (its job's drafter and k, else the
        runtime's), the shared pass costs (a seeded sampled job: the measured ones, and no drafts from earlier
        runs; its text then depends on its neighbours' pass sizes only, see docs/speculation.md)."""
        speculation = job.speculation or self.settings.speculation
        view = self.history.view(job.scope) if self.history is not None else None
        drafters = lookup_drafters(speculation.drafter, drafts_from(view, job.sampling)) or []
        reproducible = job.sampling.reproducible
        policy = DraftPolicy(k_max=self.settings.speculation.k_max, fixed=speculation.k,
                             costs=self.measured_costs if reproducible else self.costs, shapes=self.shapes,
                             shared=self.trust.setdefault(job.scope, {}), reproducible=reproducible)
        drafts = self.drafts
        if drafts is not None and speculation.drafter in ("auto", drafts.name):  # after the lookup, in auto's cascade
            seed = job.sampling.seed
            drafters.append(LaneDrafter(drafts, getattr(lane, "seq", 0), job.sampling,
                                        make_rng(None if seed is None else seed + 1), name=drafts.name,
                                        p_min=speculation.p_min))
            if drafts.token_seconds:
                policy.calibrate_drafter(drafts.name, drafts.token_seconds)
        generator = Generator(lane, self.model.vocab, drafters, job.sampling, policy)
        generator.grammars = self.grammars
        generator.compiled = job.matcher
        if view is not None:
            generator.on_end = view.feed
        return generator

    def close(self) -> None:
        try:
            if self.calibration is not None and self.calibration.improve(self.costs):
                self.calibration.save()
            save_history(self.history, self.say)
        finally:
            self._stack.close()

    def __enter__(self) -> BatchRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a job's check (``BatchRuntime.open``) left to run: how many requests, and whether each has a seed."""

    jobs: int
    seeded: bool


def seeded_job(requests: Sequence[Request], sampling: SamplingSettings) -> bool:
    """Whether every request of a job is sampled with a seed, its own or the job's: an OpenAI Batch file carries the
    seed in each line's body, and such a job is promised what ``--seed`` promises."""
    return bool(requests) and all(
        (r.seed if r.seed is not None else sampling.seed) is not None
        and (r.temperature if r.temperature is not None else sampling.temperature) > 0 for r in requests)
