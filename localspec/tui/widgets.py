"""Widgets of the chat app: the transcript, the answer being written (styled per token), stats, legend.

The answer grows in a ``Static`` holding a ``Content`` built from runs of equally styled text: ``RichLog`` only
appends whole lines, and one widget per token would make layout cost grow with the answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Label, Sparkline, Static

from localspec.events import Stats, Step, Token
from localspec.tui.conversation import Turn, answer_summary
from localspec.tui.speedup import SpeedupEstimate

# Styles are theme variables, resolved by Textual when the Content renders, so the colours follow the theme.
ACCEPTED_STYLE = "$text-success"
TARGET_STYLE = ""
GHOST_STYLE = "dim strike $text-error"
BRANCH_MARK_STYLE = "dim $text-error"  # the brackets around a losing branch of a token tree (not struck through)
STYLE_BY_KIND = {"draft": ACCEPTED_STYLE, "target": TARGET_STYLE, "ghost": GHOST_STYLE}

GHOST_SECONDS = 1.2  # how long rejected drafts stay on screen: long enough to see, short enough not to clutter


@dataclass
class Run:
    """Consecutive text of one kind (draft | target | ghost); ghosts carry the time they disappear. A ``branch``
    ghost is a losing branch of a token tree: shown in brackets, as an alternative to the text around it."""

    text: str
    kind: str
    expires: float = 0.0
    branch: bool = False


class AnswerView(Vertical):
    """The assistant's answer, token by token: accepted drafts coloured, the target's own tokens plain,
    rejected drafts as short-lived struck-through ghosts at the point where they were rejected. A pass that verified
    a token tree shows its winning branch the same way (accepted, then its rejected rest), followed by each losing
    branch as a ghost of its own, in brackets.

    Only the tail of a long answer is re-rendered: once the live text passes ``FREEZE_CHARS``, its finished lines
    move into a part of their own that is rendered once. Re-rendering a whole long answer every frame costs the
    UI thread more and more, and on a small machine that time comes out of the decoding.
    """

    DEFAULT_CSS = """
    AnswerView { height: auto; }
    AnswerView > Static { height: auto; }
    AnswerView > .summary { color: $text-muted; display: none; }
    """
    FREEZE_CHARS = 600

    def __init__(self, *, show_ghosts: bool = True, ghost_seconds: float = GHOST_SECONDS) -> None:
        super().__init__(classes="answer")
        self._done: list[Run] = []  # frozen: rendered once, never ghosts
        self._runs: list[Run] = []  # live: re-rendered on each repaint
        self._live = Static("", markup=False)
        # the stats line under the answer: inside, where it wraps (in the border it was cut off at 120 columns)
        self._summary = Static("", markup=False, classes="summary")
        self.summary = ""
        self.show_ghosts = show_ghosts
        self.ghost_seconds = ghost_seconds
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield self._live
        yield self._summary

    def set_summary(self, text: str) -> None:
        """The line under the answer (stats, why it stopped); empty: none."""
        self.summary = text
        self._summary.update(text)
        self._summary.display = bool(text)

    @property
    def runs(self) -> list[Run]:
        return self._done + self._runs

    @property
    def text(self) -> str:
        """The answer's text so far (what the model wrote; ghosts excluded)."""
        return "".join(r.text for r in self.runs if r.kind != "ghost")

    def _append(self, text: str, kind: str) -> None:
        if not text:
            return
        if self._runs and self._runs[-1].kind == kind and kind != "ghost":
            self._runs[-1].text += text
        else:
            self._runs.append(Run(text, kind))
        self._dirty = True

    def add_step(self, step: Step, now: float) -> None:
        for token in step.accepted:
            self._append(token.text, "draft")
        if self.show_ghosts:
            self._ghost(step.rejected, now)
            for run in step.rejected_branches:
                self._ghost(run, now, branch=True)
        if step.target is not None:
            self._append(step.target.text, "target")

    def _ghost(self, tokens: Sequence[Token], now: float, *, branch: bool = False) -> None:
        ghost = "".join(t.text for t in tokens)
        if ghost:
            self._runs.append(Run(ghost, "ghost", now + self.ghost_seconds, branch))
            self._dirty = True

    def add_text(self, text: str, kind: str = "target") -> None:
        self._append(text, kind)

    def drop_ghosts(self, now: float | None = None) -> None:
        """Remove ghosts that have had their time (all of them when ``now`` is None)."""
        keep = [r for r in self._runs if r.kind != "ghost" or (now is not None and r.expires > now)]
        if len(keep) != len(self._runs):
            # neighbours of the same kind that a ghost separated become one run again
            merged: list[Run] = []
            for run in keep:
                if merged and merged[-1].kind == run.kind and run.kind != "ghost":
                    merged[-1].text += run.text
                else:
                    merged.append(run)
            self._runs = merged
            self._dirty = True

    def content(self) -> Content:
        return _assemble(self.runs)

    def _freeze(self) -> None:
        """Move the finished lines of a long live tail into a part of their own (ghost-free lines only)."""
        if self._live.parent is None or sum(len(r.text) for r in self._runs) <= self.FREEZE_CHARS:
            return  # not composed yet (parts are mounted before the live tail), or nothing long to freeze
        ghost_at = next((i for i, r in enumerate(self._runs) if r.kind == "ghost"), len(self._runs))
        for i in range(ghost_at - 1, -1, -1):
            cut = self._runs[i].text.rfind("\n")
            if cut < 0:
                continue
            head = self._runs[:i] + [Run(self._runs[i].text[: cut + 1], self._runs[i].kind)]
            tail = self._runs[i].text[cut + 1 :]
            self._runs = ([Run(tail, self._runs[i].kind)] if tail else []) + self._runs[i + 1 :]
            self._done += head
            # the part ends where a line ends: the next widget starts the next line, so drop that line break
            shown = head[:-1] + [Run(head[-1].text[:-1], head[-1].kind)]
            self.mount(Static(_assemble(shown), markup=False), before=self._live)
            return

    def repaint(self, *, force: bool = False) -> bool:
        """Push the runs to the screen if they changed since the last repaint; True if they did."""
        if not (self._dirty or force):
            return False
        self._dirty = False
        self._freeze()
        # an empty live tail after frozen parts would still take a line
        self._live.display = bool(self._runs) or not self._done
        self._live.update(_assemble(self._runs) if self._runs else Content.styled("…", "dim"))
        return True


def _assemble(runs: list[Run]) -> Content:
    parts: list[tuple[str, str]] = []
    for r in runs:
        if r.branch:
            parts += [("[", BRANCH_MARK_STYLE), (r.text, GHOST_STYLE), ("]", BRANCH_MARK_STYLE)]
        else:
            parts.append((r.text, STYLE_BY_KIND[r.kind]))
    return Content.assemble(*parts)


class Transcript(VerticalScroll):
    """The scrolling conversation: user turns, answers, and notices. It knows which widget shows which turn, so
    that taking turns back (regenerate, edit) removes exactly what showed them and what followed."""

    can_focus = False  # the input keeps the focus; the mouse wheel still scrolls

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._by_turn: dict[int, Widget] = {}  # id(turn) → the widget showing it

    def on_mount(self) -> None:
        # stay at the bottom as answers grow, until the user scrolls up to read
        self.anchor()

    def add_user(self, text: str) -> Static:
        widget = Static(Content(text), classes="user")
        widget.border_title = "You"
        self.mount(widget)
        return widget

    def start_answer(self, *, show_ghosts: bool, title: str) -> AnswerView:
        view = AnswerView(show_ghosts=show_ghosts)
        view.border_title = title
        self.mount(view)
        return view

    def add_notice(self, text: str, *, severity: str = "information") -> Static:
        widget = Static(Content(text), classes=f"notice {severity}")
        self.mount(widget)
        return widget

    def link(self, turn: Turn, widget: Widget) -> None:
        self._by_turn[id(turn)] = widget

    def show_turn(self, turn: Turn) -> Widget:
        """Show a turn; an answer of a resumed conversation is plain text (which tokens were drafts is not kept)."""
        if turn.role == "user":
            widget: Widget = self.add_user(turn.text)
        else:
            view = self.start_answer(show_ghosts=False, title="Assistant")
            view.add_text(turn.text)
            view.repaint(force=True)
            view.set_summary(saved_summary(turn))
            widget = view
        self.link(turn, widget)
        return widget

    def take_back(self, turns: list[Turn]) -> None:
        """Remove the widgets of ``turns`` (the last turns of the conversation) and everything shown after them."""
        first = self._by_turn.get(id(turns[0])) if turns else None
        for turn in turns:
            self._by_turn.pop(id(turn), None)
        if first is not None:
            shown = list(self.children)
            for child in shown[shown.index(first):]:
                child.remove()

    def clear(self) -> None:
        self._by_turn.clear()
        self.remove_children()


INTERRUPTED_MARK = "interrupted: the chat closed before this answer ended · Ctrl+R answers again"


def saved_summary(turn: Turn) -> str:
    """The line under a saved answer. One saved while it streamed and never finished (the chat was quit or crashed)
    has no stats: it says so."""
    if turn.stats is not None:
        return answer_summary(turn.stats, turn.drafter)
    return INTERRUPTED_MARK if turn.stop_reason == "interrupted" else ""


class StatsPanel(Vertical):
    """Live numbers of the answer being written, and the estimated speedup once it is done."""

    HISTORY = 60  # target passes shown in the sparkline

    def compose(self) -> ComposeResult:
        yield Static("Speculation", classes="panel-title")
        yield Static(id="drafter")
        yield Static(id="rates")
        yield Label("accepted length per pass", classes="caption")
        yield Sparkline([], id="spark")
        yield Label("acceptance by draft position", classes="caption")
        yield Static(id="positions")
        yield Static(id="speedup")

    def on_mount(self) -> None:
        self.lengths: deque[float] = deque(maxlen=self.HISTORY)
        self.show_drafter("auto", None)
        self.show_stats(None, 0.0)
        self.show_speedup(None, answered=False)

    def show_drafter(self, drafter: str, k: int | None, *, pending: str | None = None) -> None:
        text = f"drafter  {drafter}" + (f"   k {k}" if k is not None else "")
        if pending is not None and pending != drafter:
            text += f"\nnext     {pending}"
        self.query_one("#drafter", Static).update(Content(text))

    def reset(self) -> None:
        self.lengths.clear()
        self.query_one("#spark", Sparkline).data = []
        self.show_stats(None, 0.0)
        self.show_speedup(None, answered=False)

    def add_lengths(self, steps: list[Step]) -> None:
        self.lengths.extend(len(s.emitted) for s in steps)
        self.query_one("#spark", Sparkline).data = list(self.lengths)

    def show_stats(self, stats: Stats | None, seconds: float) -> None:
        if stats is None or stats.target_passes == 0:
            rates = "tok/s    —\naccept   —\nlength   —"
            positions = Content.styled("—", "dim")
        else:
            tps = stats.generated_tokens / seconds if seconds > 0 else 0.0
            accept = f"{stats.acceptance_rate:.0%}" if stats.drafted else "—"
            rates = (
                f"tok/s    {tps:.1f}\n"
                f"accept   {accept}  ({stats.accepted}/{stats.drafted})\n"
                f"length   {stats.mean_accepted_length:.2f} tokens/pass"
            )
            if stats.cache_drafted:  # of the drafts, those copied from earlier requests (localspec/history)
                rates += f"\nhistory  {stats.cache_accepted}/{stats.cache_drafted} accepted"
            if stats.tree_passes:  # passes that verified several candidate branches at once (--branches)
                per_tree = stats.branches / stats.tree_passes
                trees = f"{stats.tree_passes} tree" + ("s" if stats.tree_passes != 1 else "")
                rates += f"\nbranches {per_tree:.1f} per tree, {trees}"
            positions = position_bars(stats.accepted_by_position)
        self.query_one("#rates", Static).update(Content(rates))
        self.query_one("#positions", Static).update(positions)

    def show_speedup(self, estimate: SpeedupEstimate | None, *, answered: bool = True) -> None:
        """The estimated speedup of the last answer; None: none yet, or no plain step measured to estimate from."""
        if estimate is None:
            why = "no plain step measured yet" if answered else "after an answer"
            text = Content.styled(f"speedup  — ({why})", "dim")
        else:
            ms = estimate.plain_seconds * 1000
            if estimate.capped:  # the plain-step cost is off: say so, with the figure it would have given
                detail = (f"est., capped at {estimate.ceiling:.2f} tokens/pass\n({ms:.1f} ms per plain step would"
                          f" give {estimate.raw:.2f}×)")  # fmt: skip
            elif estimate.source == "nothing drafted":
                detail = "nothing was drafted: target-only's own passes"
            elif estimate.source == "answer":
                detail = f"est. from this answer's plain passes ({ms:.1f} ms)"
            else:
                detail = f"est. from {ms:.1f} ms per plain step"
            mark = "≤ " if estimate.capped else ""
            text = Content.assemble(
                ("speedup  ", ""), (f"{mark}{estimate.shown:.2f}×", "bold"), (f" vs target-only\n{detail}", "dim")
            )
        self.query_one("#speedup", Static).update(text)


def position_bars(accepted_by_position: list[list[int]], *, rows: int = 6, width: int = 12) -> Content:
    """One bar per draft position: the share of drafts at that position the target accepted."""
    lines: list[Content] = []
    for i, (accepted, drafted) in enumerate(accepted_by_position[:rows]):
        share = accepted / drafted if drafted else 0.0
        filled = round(share * width)
        lines.append(
            Content.assemble(
                (f"{i + 1:>2} ", "dim"),
                ("█" * filled, ACCEPTED_STYLE),
                ("░" * (width - filled), "dim"),
                (f" {share:>4.0%}", ""),
            )
        )
    if len(accepted_by_position) > rows:
        lines.append(Content.styled(f"   … {len(accepted_by_position) - rows} more", "dim"))
    return Content("\n").join(lines) if lines else Content.styled("—", "dim")


class Legend(Static):
    """What the colours in an answer mean."""

    def __init__(self) -> None:
        super().__init__(self.build(True), id="legend")

    @staticmethod
    def build(ghosts: bool) -> Content:
        # one short line per colour: the side panel is narrow
        return Content.assemble(
            ("Legend\n", "bold"),
            ("accepted", ACCEPTED_STYLE), ("  drafted, target agreed\n", "dim"),
            ("produced", TARGET_STYLE), ("  the target's own token\n", "dim"),
            ("rejected", GHOST_STYLE), (f"  refused draft ({'shown' if ghosts else 'hidden'})\n", "dim"),
            ("[", BRANCH_MARK_STYLE), ("rejected", GHOST_STYLE), ("]", BRANCH_MARK_STYLE),
            ("  losing tree branch", "dim"),
        )

    def set_ghosts(self, ghosts: bool) -> None:
        self.update(self.build(ghosts))
