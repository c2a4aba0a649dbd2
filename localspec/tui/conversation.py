"""The state of a chat: its turns, the messages the chat template sees, and the Markdown export.

Pure Python and free of Textual, so that the rules (what goes into the prompt, which turns are dropped when the
context fills, what a saved transcript looks like) are testable without a terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from localspec.engine.chat import Message
from localspec.events import Stats


@dataclass
class Turn:
    """One message of the conversation. An assistant turn may carry the stats of the generation that wrote it."""

    role: str  # user | assistant
    text: str
    stats: Stats | None = None
    drafter: str = ""
    stop_reason: str = ""
    saved_id: int | None = None  # its row in the chat store, once saved


@dataclass
class Conversation:
    """Turns in order, plus the optional system message that opens every prompt."""

    system: str | None = None
    turns: list[Turn] = field(default_factory=list)

    def add_user(self, text: str) -> Turn:
        turn = Turn("user", text)
        self.turns.append(turn)
        return turn

    def add_assistant(self, text: str, stats: Stats | None = None, drafter: str = "", stop_reason: str = "") -> Turn:
        turn = Turn("assistant", text, stats, drafter, stop_reason)
        self.turns.append(turn)
        return turn

    def messages(self) -> list[Message]:
        """What the chat template renders: the system message, then every turn.

        Rendering the whole conversation each time (rather than only the new turn) keeps the prompt identical to
        what the model already holds in its cache up to the new turn, so the generator's prefix reuse prefills only
        the new part.
        """
        head = [Message("system", self.system)] if self.system else []
        return head + [Message(t.role, t.text) for t in self.turns]

    def clear(self) -> None:
        self.turns.clear()

    def take_back(self, turn: Turn) -> list[Turn]:
        """Remove ``turn`` and every turn after it (regenerate an answer, edit a question); returns them."""
        index = next(i for i, t in enumerate(self.turns) if t is turn)
        removed = self.turns[index:]
        del self.turns[index:]
        return removed

    def last(self, role: str) -> Turn | None:
        """The newest turn of ``role`` (user | assistant), if any."""
        return next((t for t in reversed(self.turns) if t.role == role), None)

    @property
    def exchanges(self) -> int:
        """Number of user turns (a user turn and its answer make one exchange)."""
        return sum(1 for t in self.turns if t.role == "user")

    def drop_oldest(self) -> bool:
        """Forget the oldest exchange (a user turn and the answer that followed it). False if nothing to drop.

        The newest user turn is never dropped: it is the question being asked.
        """
        if self.exchanges <= 1:
            return False
        del self.turns[0]
        while self.turns and self.turns[0].role != "user":
            del self.turns[0]
        return True

    def fit(self, count_tokens: Callable[[list[Message]], int], budget: int) -> int:
        """Drop the oldest exchanges until the rendered prompt is at most ``budget`` tokens; returns how many.

        Raises nothing: when even the last question alone does not fit, the caller finds out from the count.
        """
        dropped = 0
        while count_tokens(self.messages()) > budget and self.drop_oldest():
            dropped += 1
        return dropped

    def to_markdown(self, model: str, *, now: datetime | None = None) -> str:
        """The transcript as Markdown: one section per turn, with a stats line under each answer."""
        stamp = (now or datetime.now()).strftime("%Y-%m-%d %H:%M")
        lines = [f"# localspec chat — {model}", "", f"_Saved {stamp}._", ""]
        if self.system:
            lines += ["## System", "", self.system.strip(), ""]
        for turn in self.turns:
            lines += ["## You" if turn.role == "user" else "## Assistant", "", turn.text.strip() or "_(empty)_", ""]
            if turn.role == "assistant" and turn.stats is not None:
                lines += [f"_{answer_summary(turn.stats, turn.drafter)}_", ""]
        return "\n".join(lines).rstrip() + "\n"


def answer_summary(stats: Stats, drafter: str) -> str:
    """One line about a generation, for the transcript and the saved Markdown."""
    parts = [
        f"{stats.generated_tokens} tokens",
        f"{stats.tokens_per_second:.1f} tok/s",
        f"drafter {drafter or 'none'}",
    ]
    if stats.drafted:
        parts.append(f"accepted {stats.accepted}/{stats.drafted} ({stats.acceptance_rate:.0%})")
    if stats.cache_drafted:
        parts.append(f"{stats.cache_accepted}/{stats.cache_drafted} from earlier requests")
    if stats.tree_passes:
        parts.append(f"{stats.tree_passes} tree passes, {stats.branches} branches")
    if stats.stop_reason and stats.stop_reason != "eog":
        parts.append(f"stopped: {stats.stop_reason}")
    return " · ".join(parts)
