"""The answer being written: the engine's steps onto its view and onto the stats panel, one repaint per frame."""

from __future__ import annotations

import time

from localspec.events import Finished, Stats, Step
from localspec.tui.conversation import Turn, answer_summary
from localspec.tui.messages import Prefilled
from localspec.tui.speedup import estimate_speedup
from localspec.tui.widgets import AnswerView, StatsPanel


class LiveAnswer:
    """One answer from its first frame to its summary line. ``steps`` keeps every step shown, in order; ``turn`` is
    the answer in the conversation once it has text (saved as it streams)."""

    def __init__(self, view: AnswerView, panel: StatsPanel, drafter: str) -> None:
        self.view = view
        self.panel = panel
        self.drafter = drafter  # the user's choice; with `auto` each step names the drafter it used
        self.steps: list[Step] = []
        self.stats = Stats()
        self.t0 = 0.0  # the engine's clock when decoding began (live tok/s is timed on the engine's clock)
        self.last_step_time = 0.0
        self.turn: Turn | None = None
        panel.reset()
        panel.show_drafter(drafter, None)
        view.repaint(force=True)  # shows "…" until the first tokens arrive

    def prefilled(self, message: Prefilled) -> None:
        self.t0 = message.decode_started
        p = message.prefill
        self.view.border_subtitle = f"prompt {p.prompt_tokens} tokens, {p.new_tokens} new"

    def show(self, steps: list[Step], stamp: float) -> None:
        """Add ``steps`` (``stamp``: the engine's clock at the last of them) and repaint once."""
        now = time.perf_counter()
        self.steps.extend(steps)
        for step in steps:
            self.view.add_step(step, now)
            self.stats.add_step(step)
        self.view.drop_ghosts(now)
        self.view.repaint()
        if steps:
            self.last_step_time = stamp
            last = steps[-1]
            used = last.drafter
            label = self.drafter if used in (self.drafter, "none") else f"{self.drafter} → {used}"
            self.panel.show_drafter(label, last.k)
            self.panel.add_lengths(steps)
            self.panel.show_stats(self.stats, max(self.last_step_time - self.t0, 1e-9))

    def finish(self, finished: Finished, drafter: str, plain_seconds_per_token: float) -> float | None:
        """The answer ended: its last text, summary line and final stats. Returns the estimated speedup."""
        stats = finished.stats
        self.view.add_text(finished.tail)
        self.view.drop_ghosts()
        self.view.repaint()
        self.view.border_subtitle = ""  # the prompt's size, while it streamed
        self.view.set_summary(answer_summary(stats, drafter))
        self.panel.show_stats(stats, stats.decode_seconds)
        estimate = estimate_speedup(stats, plain_seconds_per_token)
        self.panel.show_speedup(estimate)
        return estimate.shown if estimate is not None else None
