"""`localspec chat`: a Textual app that shows speculative decoding as it happens.

The engine (``tui/engine.py``) runs every llama.cpp call on one thread and queues the steps of an answer; a timer
here takes them and repaints within a small CPU budget. Every change to the turns goes through a Session
(``tui/session.py``), which keeps the saved copy in step; dialogs live in ``tui/screens.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Footer, Header
from textual.worker import get_current_worker

from localspec.errors import UserError
from localspec.events import Finished, Prefill, Step
from localspec.tui.commands import ChatCommands
from localspec.tui.conversation import Conversation
from localspec.tui.engine import REPAINT_HZ, Engine, FrameBudget
from localspec.tui.live import LiveAnswer
from localspec.tui.messages import (
    AnswerFailed,
    AnswerFinished,
    DrafterSwitched,
    Prefilled,
    RuntimeFailed,
    RuntimeLoading,
    RuntimeReady,
)
from localspec.tui.prompt import PromptInput
from localspec.tui.session import Session
from localspec.tui.slash import as_message, command_word, find, unknown_hint
from localspec.tui.widgets import Legend, StatsPanel, Transcript

if TYPE_CHECKING:
    from localspec.engine.chat import Message
    from localspec.runtime import Runtime
    from localspec.settings import Settings
    from localspec.tui.store import ChatStore

NARROW_BELOW = 80  # columns: narrower than this, the stats panel folds away and the transcript takes the width
LOADING_PLACEHOLDER = "Loading the model… type away: Enter sends once it is open"
READY_PLACEHOLDER = "Ask something and press Enter  (Shift+Enter: new line · F1 or ?: help)"


class ChatApp(ChatCommands, App[None]):
    """Chat with a local model and watch the drafter's tokens being accepted and rejected."""

    CSS_PATH = Path(__file__).with_name("chat.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False  # ctrl+p would shadow nothing useful here and clutters the footer
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (NARROW_BELOW, "-wide")]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+r", "regenerate", "Again", priority=True),
        Binding("f3", "edit_last", "Edit", priority=True),
        Binding("f4", "copy_answer", "Copy", priority=True),
        Binding("ctrl+o", "conversations", "Chats", priority=True),
        Binding("f2", "cycle_drafter", "Drafter", priority=True),
        Binding("ctrl+g", "toggle_ghosts", "Ghosts", show=False, priority=True),
        Binding("ctrl+l", "clear", "New", priority=True),
        Binding("ctrl+s", "save", "Save", show=False, priority=True),
        Binding("f1", "help", "Help", priority=True),  # and `?` in an empty input (PromptInput decides)
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # Textual 8 binds Ctrl+C to copy in the input (nothing without a selection) and, below it, to a hint; older
        # versions quit with it. Here it copies a selection, else stops an answer, else says how to quit.
        Binding("ctrl+c", "interrupt", show=False, priority=True),
    ]

    def __init__(
        self,
        options: Settings,
        *,
        system: str | None = None,
        save_dir: Path | None = None,
        store: ChatStore | None = None,
        resume: int | None = None,
        runtime_factory: Callable[[Settings], Runtime] | None = None,
    ) -> None:
        """``store``: where conversations are saved as they happen (None: nowhere); ``resume``: a saved one."""
        super().__init__()
        self.options = options
        self.save_dir = (save_dir or Path.cwd()).absolute()  # said in full when a transcript is saved there
        self.engine = Engine(options, self.post_message, runtime_factory)
        self.session = Session(store, system, on_error=self._store_failed)
        self._resume = resume
        self.ready = False  # the model is open
        self.failed = False  # the model could not be opened
        self._queued: tuple[str, Widget] | None = None  # a question sent while the model loads, and its widget
        self.busy = False  # an answer is being generated
        self.show_ghosts = True
        self.drafter_choice = options.speculation.drafter  # what the next answer uses
        self.predict_next: str | None = None  # what the next answer drafts from (/predict: the last answer)
        self.last_finished: Finished | None = None
        self.last_speedup: float | None = None
        self.last_saved: Path | None = None
        self.last_prefill: Prefill | None = None
        self._live: LiveAnswer | None = None  # the answer being written, or the last one
        self._frames = FrameBudget()

    # ---- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≫")
        with Horizontal(id="main"):
            yield Transcript(id="transcript")
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield Legend()
        # enabled while the model loads: what is typed meanwhile stays, and Enter queues the question
        yield PromptInput(submit=self._submit, placeholder=LOADING_PLACEHOLDER, id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.engine.start()  # before the UI thread yields: the engine keeps normal priority
        self.sub_title = "loading the model…"
        self._ticker = self.set_interval(1 / REPAINT_HZ, self._drain, pause=True)
        self.stats_panel.show_drafter(self.drafter_choice, None)
        if self._resume is not None:
            self._show_saved(self._resume)
        self.prompt_input.focus()
        self._open_runtime()

    @property
    def rt(self) -> Runtime | None:
        return self.engine.rt

    @property
    def conversation(self) -> Conversation:
        return self.session.conversation

    @property
    def answer_steps(self) -> list[Step]:
        """The steps of the current (or last) answer, in order."""
        return self._live.steps if self._live is not None else []

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    @property
    def prompt_input(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    # ---- opening and closing the model ----------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="runtime", exit_on_error=False)
    def _open_runtime(self) -> None:
        self.engine.open()

    def on_runtime_ready(self, message: RuntimeReady) -> None:
        self.ready = True
        self.session.model = message.model_name
        if message.template_source == "model":
            template = "chat template from the model"
        else:  # say it, in few words: "built-in 'gemma' chat template (none in the model file)"
            template = f"{message.template_source.split(' (')[0]} chat template (none in the model file)"
        self.sub_title = f"{message.model_name} · {template}"
        self.drafter_choice = message.drafter
        self.stats_panel.show_drafter(message.drafter, None)
        self.transcript.add_notice(
            f"{message.model_name} is ready (drafter {message.drafter}). Type a message and press Enter;"
            " F1 or ? for help."
        )
        for notice in message.notices:
            self.transcript.add_notice(notice, severity="warning")
        self.prompt_input.placeholder = READY_PLACEHOLDER
        if self._queued is not None:
            text, widget = self._queued
            self._queued = None
            turn = self.session.add_user(text)
            self.transcript.link(turn, widget)
            self._ask()

    def on_runtime_loading(self, message: RuntimeLoading) -> None:
        self.transcript.add_notice(message.text[:1].upper() + message.text[1:])

    def on_runtime_failed(self, message: RuntimeFailed) -> None:
        self.failed = True
        self.sub_title = "no model"
        self.transcript.add_notice(f"The model could not be opened: {message.error}", severity="error")
        self.transcript.add_notice("Quit with Ctrl+Q and start again with another --model.")
        box = self.prompt_input
        box.placeholder = "No model: press Ctrl+Q to quit"
        box.disabled = True

    async def on_unmount(self) -> None:
        # Quitting mid-answer: stop the answer at its next step, then free llama.cpp only once it let go.
        self.engine.stop_requested.set()
        await asyncio.to_thread(self.engine.close)
        self.engine.shutdown()

    # ---- asking ---------------------------------------------------------------------------------------------

    def _submit(self, text: str) -> bool:
        """Enter in the input, decided at once (the input clears when this says True): a /command or a question."""
        word = command_word(text)
        if word is None:
            return self._send(as_message(text))
        command = find(word)
        if command is None:
            self.notify(unknown_hint(word), severity="warning", timeout=6)
            return False  # stays in the input, to be fixed or sent with //
        # after this key: an action may open a dialog, or quit
        self.call_next(self.run_action, command.action)
        return True

    def _send(self, text: str) -> bool:
        box = self.prompt_input
        if self.failed:
            self.notify("No model is open: Ctrl+Q quits.", severity="warning")
            return False
        if self.busy:
            self.notify("An answer is being written: wait, or press Esc to stop it.", severity="warning")
            return False
        if not self.ready:
            if self._queued is not None:
                self.notify("A question is already waiting for the model.", severity="warning")
                return False
            box.remember(text)
            self._queued = (text, self.transcript.add_user(text))
            self.transcript.add_notice("The model is still loading: the question is sent once it is open.")
            return True
        box.remember(text)
        self.transcript.show_turn(self.session.add_user(text))
        self._ask()
        return True

    def _unqueue(self) -> None:
        """The screen is cleared while a question waits for the model: the question goes back into the input."""
        if self._queued is not None:
            self.prompt_input.put_back(self._queued[0])
            self._queued = None

    def _count_tokens(self, messages: list[Message]) -> int:
        return len(self._tokens(messages))

    def _tokens(self, messages: list[Message]) -> list[int]:
        assert self.rt is not None
        return self.rt.chat_tokens(messages)  # what the user typed stays text: no forged turns

    def _ask(self) -> None:
        """Answer the last user turn: render the whole conversation (the cache keeps what is unchanged)."""
        assert self.rt is not None
        try:
            tokens = self._tokens(self.conversation.messages())
        except UserError as exc:
            self.transcript.add_notice(str(exc), severity="error")
            return
        n_ctx = self.options.runtime.n_ctx
        if len(tokens) >= n_ctx:
            self._offer_context_choice(
                f"This conversation is {len(tokens)} tokens and the context holds {n_ctx} (--ctx): the question "
                "cannot be answered as it is."
            )
            return
        view = self.transcript.start_answer(show_ghosts=self.show_ghosts, title="Assistant")
        self._live = LiveAnswer(view, self.stats_panel, self.drafter_choice)
        self.engine.begin()
        self.busy = True
        self._ticker.resume()
        self.refresh_bindings()
        prediction, self.predict_next = self.predict_next, None
        self._generate(tokens, self.drafter_choice, prediction)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, tokens: list[int], drafter: str, prediction: str | None = None) -> None:
        worker = get_current_worker()
        self.engine.generate(tokens, drafter, lambda: worker.is_cancelled, self.session.id or 0, prediction)

    def on_drafter_switched(self, message: DrafterSwitched) -> None:
        if message.error:
            self.transcript.add_notice(f"Drafter unchanged ({message.drafter}): {message.error}", severity="warning")
        self.drafter_choice = message.drafter
        self.stats_panel.show_drafter(message.drafter, None)

    def on_prefilled(self, message: Prefilled) -> None:
        self.last_prefill = message.prefill
        if self._live is not None:
            self._live.prefilled(message)

    def _drain(self, *, final: bool = False, save: bool = True) -> None:
        """Timer tick: move the steps the engine queued onto the screen, in one repaint, and save what it shows."""
        if not final and self._frames.skip():
            return  # the queue keeps the steps; a later frame shows them all at once
        steps, stamp = self.engine.take_steps()
        if self._live is not None:
            self._live.show(steps, stamp)
            if steps and save:
                self._save_partial()

    def _save_partial(self) -> None:
        """Save the answer as far as it is on screen, marked interrupted until it ends: quitting mid-answer, a
        closed terminal or a crash keeps it. One small transaction per repaint (the store writes ahead)."""
        live = self._live
        if live is None or not self.busy:
            return
        text = live.view.text
        if not text or (live.turn is not None and live.turn.text == text):
            return  # nothing new; and never an empty answer
        created = live.turn is None
        live.turn = self.session.save_answer(live.turn, text, None, live.drafter, "interrupted")
        if created:
            self.transcript.link(live.turn, live.view)

    def on_answer_finished(self, message: AnswerFinished) -> None:
        self._drain(final=True, save=False)  # the final save follows
        finished = self.last_finished = message.finished
        self._end_generation()
        live = self._live
        if live is not None:
            self.last_speedup = live.finish(finished, message.drafter, message.plain_seconds_per_token)
            if not live.view.text and finished.reason == "interrupted":
                self._stopped_before_answering()
                return
            live.turn = self.session.save_answer(
                live.turn, live.view.text, finished.stats, message.drafter, finished.reason
            )
            self.transcript.link(live.turn, live.view)
        if finished.reason == "interrupted":
            self.transcript.add_notice("Stopped. The partial answer stays in the conversation.")
        elif finished.reason == "length":
            self.transcript.add_notice(
                f"The answer reached --max-tokens ({self.options.generation.max_tokens}); ask it to continue."
            )
        elif finished.reason == "context_full":
            self._offer_context_choice("The answer filled the context window (--ctx) and stopped.")

    def _stopped_before_answering(self) -> None:
        """Esc before the first token: no empty answer is kept; the question goes back into the input (in front of
        anything typed since), so the conversation still alternates and Enter asks again."""
        question = self.conversation.last("user")
        self._live = None
        if question is None:
            return
        self.transcript.take_back(self.session.take_back(question))
        self.prompt_input.put_back(question.text)
        self.transcript.add_notice("Stopped before the answer began: your question is back in the input.")

    def on_answer_failed(self, message: AnswerFailed) -> None:
        self._drain()
        self._end_generation()
        if self._live is not None and not self._live.view.text:
            self._live.view.remove()
        self._live = None
        if message.context_full:
            self._offer_context_choice(message.error)
        else:
            self.transcript.add_notice(message.error, severity="error")

    def _end_generation(self) -> None:
        self.busy = False
        self._ticker.pause()
        self.refresh_bindings()
        self.prompt_input.focus()
