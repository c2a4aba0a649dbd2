"""Runs a benchmark: one loaded target, every (prompt, drafter) pair, interleaved across repeats.

Order matters for fair numbers on a real machine, whose speed drifts (thermal throttling, other processes):
repeats are the outer loop and, within one, each prompt's drafters run back to back, so drift hits every drafter
of a prompt alike, and an interrupted run has already measured every pair once. The drafter order rotates from
one repeat to the next so that no drafter always runs first after a prompt change.
Each run starts from an empty KV cache and a policy that has forgotten what earlier drafts taught it, so no run
inherits another's acceptance; what a pass costs on this machine is the machine's, and every run keeps correcting it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localspec.bench import anchors as anchor_names
from localspec.bench.compare import BASELINE, Divergence, annotate, logit_gap
from localspec.bench.records import NEAR_TIE_MARGIN, RunRecord
from localspec.bench.suite import BenchPrompt, Suite
from localspec.errors import UserError
from localspec.events import Finished, Step
from localspec.settings import BRANCHES_MAX, DRAFTERS, GenerationSettings, SpeculationSettings

if TYPE_CHECKING:
    from localspec.runtime import Runtime
    from localspec.speculative.survival import Survival

K_MAX = SpeculationSettings().k_max  # the longest draft a pass verifies
# a drafter's runs given the row's prediction (OpenAI's Predicted Outputs), beside its runs without: "ngram+prediction"
PREDICTED = "+prediction"
WARMUP_TOKENS = 8  # per drafter, before anything is timed: opens drafters, faults in weights, sizes buffers


@dataclass(frozen=True, slots=True)
class Job:
    repeat: int
    prompt_index: int
    drafter: str


def schedule(n_prompts: int, drafters: Sequence[str], repeat: int) -> list[Job]:
    """The run order: repeat-major, then prompt, then drafter (rotated by one each repeat)."""
    jobs: list[Job] = []
    for r in range(repeat):
        shift = r % len(drafters) if drafters else 0
        order = [*drafters[shift:], *drafters[:shift]]
        for p in range(n_prompts):
            jobs.extend(Job(r, p, d) for d in order)
    return jobs


def schedule_job(n_prompts: int, drafters: Sequence[str], repeat: int) -> list[Job]:
    """``bench --job``'s order: the suite's prompts in order, as one job whose history carries over (each prompt's
    repeats and drafters back to back, rotated as ``schedule`` rotates them)."""
    jobs: list[Job] = []
    for p in range(n_prompts):
        for r in range(repeat):
            shift = r % len(drafters) if drafters else 0
            jobs.extend(Job(r, p, d) for d in [*drafters[shift:], *drafters[:shift]])
    return jobs


def halves(records: Sequence[RunRecord], prompt_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per drafter, tok/s over the first and the second half of a job's prompts (tokens summed over seconds summed,
    every repeat), and each half's speedup over target-only."""
    cut = set(prompt_ids[len(prompt_ids) // 2 :])
    sums: dict[tuple[str, bool], list[float]] = {}
    for r in records:
        if r.anchor:
            continue
        acc = sums.setdefault((r.drafter, r.prompt_id in cut), [0.0, 0.0])
        acc[0] += r.generated_tokens
        acc[1] += r.decode_seconds
    out: dict[str, dict[str, float]] = {}
    for (drafter, second), (tokens, seconds) in sums.items():
        out.setdefault(drafter, {})["second" if second else "first"] = tokens / seconds if seconds else 0.0
    base = out.get(BASELINE, {})
    for row in out.values():
        for half in ("first", "second"):
            if base.get(half) and half in row:
                row[f"{half}_speedup"] = row[half] / base[half]
    return out


def with_predictions(drafters: Sequence[str], suite: Suite) -> list[str]:
    """Each drafter once more, given the rows' predictions, where the suite has any. Target-only is not: it drafts
    nothing, a prediction included (speculative/loop.py), and stays the baseline of both."""
    if not any(p.prediction for p in suite.prompts):
        return list(drafters)
    return [*drafters, *(f"{d}{PREDICTED}" for d in drafters if d != BASELINE and d not in anchor_names.NAMES)]


def split_variant(name: str) -> tuple[str, int | None, int | None]:
    """``ngram:k7`` → ("ngram", 7, None): a drafter with its draft length pinned; ``ngram:b4`` → ("ngram", None, 4):
    token trees of up to 4 candidates; ``ngram:k3b4`` both; ``ngram`` → ("ngram", None, None); a run given the
    row's prediction (``ngram+prediction``) is its drafter's."""
    drafter, _, variant = name.removesuffix(PREDICTED).partition(":")
    if not variant:
        return drafter, None, None
    found = re.fullmatch(r"(?:k(\d+))?(?:b(\d+))?", variant)
    k, b = (int(g) if g else None for g in found.groups()) if found else (None, None)
    if (not found or (k is None and b is None) or (k is not None and k > K_MAX)
            or (b is not None and not 1 <= b <= BRANCHES_MAX)):
        raise UserError(f"bad drafter variant {name!r} in --drafters: write NAME:kN (N from 0 to {K_MAX}), NAME:bM "
                        f"(M from 1 to {BRANCHES_MAX} branches) or NAME:kNbM, e.g. ngram:k7 or ngram:b4")
    return drafter, k, b


def parse_drafters(spec: str, *, draft_model: str | None, anchors: bool) -> list[str]:
    """``--drafters a,b,c`` → names, validated; the target-only baseline is always measured, first.
    ``NAME:kN`` pins the draft length of one entry, so fixed and adaptive lengths compare in one run."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UserError("--drafters is empty: give a comma-separated list, e.g. none,ngram,ngram:k7,auto")
    for n in names:
        if n.endswith(PREDICTED):
            raise UserError(f"{n!r} in --drafters: each drafter runs again with the rows' predictions where the "
                            f"suite has them; give the drafter alone ({n.removesuffix(PREDICTED)!r})")
        if split_variant(n)[0] not in DRAFTERS:
            raise UserError(f"unknown drafter {n!r} in --drafters: choose from {', '.join(DRAFTERS)}")
    if any(split_variant(n)[0] == "draft" for n in names) and not draft_model:
        raise UserError("--drafters includes 'draft' but no draft model was given: pass --draft NAME|PATH")
    ordered = [BASELINE, *(n for n in dict.fromkeys(names) if n != BASELINE)]
    return ordered + (list(anchor_names.NAMES) if anchors else [])


@dataclass
class Outcome:
    records: list[RunRecord] = field(default_factory=list)
    interrupted: bool = False
    planned: int = 0


Progress = Callable[[int, int, Job | None, str], None]
"""(done, total, job about to run or None when finished, what it is) → None."""


class Bench:
    """Drives a :class:`localspec.runtime.Runtime` (and optionally the anchors) through a suite."""

    def __init__(self, rt: Runtime, suite: Suite, drafters: Sequence[str], repeat: int,
                 anchors: anchor_names.Anchors | None = None, branches: int = 1, job: bool = False) -> None:
        """``branches``: --branches for every drafter (NAME:bM overrides it per entry; the runtime's context must
        hold as many sequences as the widest entry). ``job``: the suite in order as one job, drafting from the
        prompts before (the runtime's history, which this then feeds by hand: each prompt's target-only answer once
        all its runs are done, so that no run of a prompt ever drafts from its own answer)."""
        self.rt = rt
        self.job = job
        # what each drafter's runs learned of the history's worth, carried from one prompt to the next: a prompt's
        # runs start from what its drafter knew after the prompts before, never from another run of the same prompt
        self._trust: dict[str, dict[str, Survival]] = {}
        self._trust_next: dict[str, dict[str, Survival]] = {}
        self.branches = branches
        self.suite = suite
        self.drafters = list(drafters)
        self.repeat = repeat
        self.anchors = anchors
        self._tokens: dict[str, list[int]] = {}
        self._predictions: dict[str, tuple[int, ...]] = {}
        # the near-tie margin of a gap measured on each path: the device's own once ``check`` has measured (or read)
        # them
        self.margins = {"prefill": NEAR_TIE_MARGIN, "decode": NEAR_TIE_MARGIN}

    def prompt_tokens(self, prompt: BenchPrompt) -> list[int]:
        if prompt.id not in self._tokens:
            self._tokens[prompt.id] = self.rt.prompt_tokens(prompt.prompt, chat=prompt.chat)
        return self._tokens[prompt.id]

    def prediction_tokens(self, prompt: BenchPrompt) -> tuple[int, ...]:
        if prompt.id not in self._predictions:
            self._predictions[prompt.id] = self.rt.prediction_tokens(prompt.prediction)
        return self._predictions[prompt.id]

    def warm_up(self, progress: Progress | None = None) -> None:
        """One short untimed generation per drafter: opens each drafter now, so that an incompatible draft model
        fails before any measurement, and so that first-use costs land in no measurement."""
        first = self.suite.prompts[0]
        drafters = [d for d in self.drafters if not d.endswith(PREDICTED)]  # the same drafters, given a prediction
        for i, drafter in enumerate(drafters):
            if progress:
                progress(i, len(drafters), None, f"warming up {drafter}")
            self._run_one(first, drafter, -1, WARMUP_TOKENS)

    def jobs(self) -> list[Job]:
        """The runs in their order (``schedule``), a drafter's runs with a prediction only for rows that have one."""
        jobs = (schedule_job if self.job else schedule)(len(self.suite.prompts), self.drafters, self.repeat)
        prompts = self.suite.prompts
        return [j for j in jobs if not j.drafter.endswith(PREDICTED) or prompts[j.prompt_index].prediction]

    def run(self, progress: Progress | None = None) -> Outcome:
        jobs = self.jobs()
        out = Outcome(planned=len(jobs))
        try:
            for i, job in enumerate(jobs):
                prompt = self.suite.prompts[job.prompt_index]
                if progress:
                    progress(i, len(jobs), job, f"{prompt.id} · {job.drafter} · repeat {job.repeat + 1}/{self.repeat}")
                record = self._run_one(prompt, job.drafter, job.repeat, prompt.max_tokens)
                if record is None:  # Ctrl-C inside the generation loop: the run is incomplete, drop it
                    out.interrupted = True
                    break
                out.records.append(record)
                if self.job and (i + 1 == len(jobs) or jobs[i + 1].prompt_index != job.prompt_index):
                    self._learn(prompt, out.records)
            if progress and not out.interrupted:
                progress(len(jobs), len(jobs), None, "done")
        except KeyboardInterrupt:
            out.interrupted = True
        return out

    def _learn(self, prompt: BenchPrompt, records: list[RunRecord]) -> None:
        """All of ``prompt``'s runs are done: its target-only answer joins the history the next prompts draft from,
        and each drafter's trust moves on to what its first repeat learned."""
        history = self.rt.history
        answer = next((r for r in records if r.prompt_id == prompt.id and r.drafter == BASELINE), None)
        if history is not None and answer is not None:
            history.feed(self.prompt_tokens(prompt) + answer.tokens, force=True)
        self._trust.update(self._trust_next)
        self._trust_next = {}

    def check(self, records: list[RunRecord]) -> None:
        """Compare every run with its baseline, measuring logit gaps at divergences with the target model."""
        try:
            self.margins = self.rt.noise().margins()
            annotate(records, self._gap, self.margins)
        except KeyboardInterrupt:
            annotate(records)  # a second Ctrl-C: report divergences unclassified rather than not at all

    def _run_one(self, prompt: BenchPrompt, drafter: str, repeat: int, max_tokens: int) -> RunRecord | None:
        if drafter in anchor_names.NAMES:
            assert self.anchors is not None
            a = self.anchors.run(drafter, prompt.prompt, max_tokens)
            retokenized = self.rt.model.vocab.tokenize(a.text, add_special=False, parse_special=False)
            return RunRecord(prompt.id, prompt.category, drafter, repeat, retokenized, a.text, a.generated_tokens,
                             a.decode_seconds, a.tokens_per_second, stop_reason=a.stop_reason, anchor=True)
        rt = self.rt
        name, k, branches = split_variant(drafter)
        rt.set_drafter(name)
        # the policy learns acceptance across generations: a measurement must not inherit what an earlier run (or
        # another drafter) taught it about the text; pass costs are the device's and carry over
        # --k for every drafter unless NAME:kN says otherwise; each run prefills its prompt from scratch, the same
        # way (batching moves logits)
        rt.fresh(k=k, branches=self.branches if branches is None else branches, clear_cache=True)
        if self.job:
            # what the job's earlier prompts taught of earlier requests' drafts (not of their own text: fresh)
            policy = rt.generator.policy
            policy.shared = copy.deepcopy(self._trust.get(drafter, {}))
            if repeat == 0:
                self._trust_next[drafter] = policy.shared
        tokens: list[int] = []
        pieces: list[str] = []
        finished: Finished | None = None
        predicted = self.prediction_tokens(prompt) if drafter.endswith(PREDICTED) else ()
        for event in rt.generate(self.prompt_tokens(prompt), GenerationSettings(
                max_tokens=max_tokens, constraint=prompt.constraint, prediction=predicted)):
            if isinstance(event, Step):
                for t in event.emitted:
                    tokens.append(t.id)
                    pieces.append(t.text)
            elif isinstance(event, Finished):
                finished = event
        assert finished is not None
        if finished.reason == "interrupted":
            return None
        s = finished.stats
        drafted = drafter != BASELINE
        text = "".join(pieces) + finished.tail
        schema = prompt.constraint is not None and prompt.constraint.kind == "json_schema"
        return RunRecord(
            prompt.id, prompt.category, drafter, repeat, tokens, text,
            s.generated_tokens, s.decode_seconds, s.tokens_per_second,
            s.acceptance_rate if drafted else None, s.mean_accepted_length if drafted else None, s.stop_reason,
            target_passes=s.target_passes if drafted else None, tree_passes=s.tree_passes if drafted else None,
            branches=s.branches if drafted else None,
            forced_drafted=s.forced_drafted if schema else None, forced_accepted=s.forced_accepted if schema else None,
            valid=self._valid(prompt, text) if schema else None,
        )

    def _valid(self, prompt: BenchPrompt, text: str) -> bool:
        """The answer parses as JSON and validates under the prompt's schema (the product's own validator)."""
        constraint = prompt.constraint
        grammars = self.rt.grammars
        assert constraint is not None and grammars is not None
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return grammars.matches(json.loads(constraint.text), value, constraint.separators)

    def _gap(self, baseline: RunRecord, run: RunRecord, div: Divergence) -> float | tuple[float, str] | None:
        """Re-decode prompt + the common prefix in one batch and compare the two candidates' logits."""
        eos = self.rt.model.vocab.eos
        # a side that ended at this position ended on end-of-generation (budgets are equal): compare with EOS
        a = div.baseline_token if div.baseline_token is not None else (eos if baseline.stop_reason == "eog" else None)
        b = div.token if div.token is not None else (eos if run.stop_reason == "eog" else None)
        if a is None or b is None:
            return None
        prompt = self._tokens.get(baseline.prompt_id)
        if prompt is None:
            return None
        context = [*prompt, *baseline.tokens[: div.position]]
        gap = logit_gap(self.rt.score(context), a, b)
        if gap <= self.margins["prefill"]:
            return gap
        # beyond the margin on the prefill's kernels: measure again on target-only's own path (1 row a pass after
        # the prompt) before calling it a bug; rare, so the slower path costs little
        return logit_gap(self.rt.score(context, one_by_one_from=len(prompt)), a, b), "decode"
