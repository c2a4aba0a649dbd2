"""`localspec chat`: a Textual app that shows speculative decoding as it happens.

Threads: the model is opened and every answer generated on one engine thread (one OpenMP team for llama.cpp);
it never touches a widget. It appends each Step to a deque and posts a handful of messages (ready, prefilled,
finished, failed); a timer on the UI thread drains the deque and repaints, skipping frames past a small CPU budget.
Per-token ``call_from_thread`` would block the generator until the UI had caught up, and a repaint per token would
steal CPU from llama.cpp.

The app builds on the events of the speculation loop only (``Generator.generate`` → Prefill | Step | Finished)
and on the Runtime's public calls (``set_drafter``, ``chat_template``); it does not reach into the loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header
from textual.worker import get_current_worker

from localspec.errors import ContextFullError, UserError
from localspec.events import Finished, Prefill, Stats, Step
from localspec.settings import DRAFTERS
from localspec.tui.conversation import Conversation, answer_summary
from localspec.tui.messages import (
    AnswerFailed,
    AnswerFinished,
    DrafterSwitched,
    Prefilled,
    RuntimeFailed,
    RuntimeReady,
)
from localspec.tui.prompt import PromptInput
from localspec.tui.widgets import (
    AnswerView,
    ContextFullScreen,
    HelpScreen,
    Legend,
    StatsPanel,
    Transcript,
)

if TYPE_CHECKING:
    from localspec.cli.options import Options
    from localspec.engine.chat import Message
    from localspec.runtime import Runtime

REPAINT_HZ = 30  # repaints per second while an answer streams: smooth to the eye, cheap for the CPU
# Share of one core the UI may spend while an answer streams. On a small machine every millisecond the UI takes
# stalls llama.cpp's threads (they wait for each other at each step), costing about twice that in decoding speed:
# past this budget frames are skipped (steps still accumulate) and the frame rate drops instead. Measured on 2
# cores, 512-token answers: no painting during the answer 97% of `run`'s tok/s, 8% budget 85%, 2.5% ~parity.
UI_CPU_BUDGET = 0.025
MIN_FRAME_SECONDS = 0.5  # whatever the budget, the answer moves at least this often
DRAFTER_CYCLE = ("none", "ngram", "draft", "early-exit", "auto")
assert set(DRAFTER_CYCLE) == set(DRAFTERS)


def open_runtime(options: Options) -> Runtime:
    from localspec.runtime import Runtime

    return Runtime.open(options.model, options.runtime, options.speculation, options.sampling)


class ChatApp(App[None]):
    """Chat with a local model and watch the drafter's tokens being accepted and rejected."""

    CSS_PATH = Path(__file__).with_name("chat.tcss")  # absolute: subclasses elsewhere find it too
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False  # ctrl+p would shadow nothing useful here and clutters the footer

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop"),
        Binding("f2", "cycle_drafter", "Drafter", priority=True),
        Binding("ctrl+g", "toggle_ghosts", "Ghosts", priority=True),
        Binding("ctrl+l", "clear", "Clear", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("f1", "help", "Help", priority=True),  # and `?` in an empty input (PromptInput decides)
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        options: Options,
        *,
        system: str | None = None,
        save_dir: Path | None = None,
        runtime_factory: Callable[[Options], Runtime] = open_runtime,
    ) -> None:
        super().__init__()
        self.options = options
        self.save_dir = save_dir or Path.cwd()
        self._runtime_factory = runtime_factory
        self.rt: Runtime | None = None
        self.conversation = Conversation(system=system)
        self.ready = False  # the model is open
        self.busy = False  # an answer is being generated
        self.show_ghosts = True
        self.drafter_choice = options.speculation.drafter  # what the next answer uses
        self.last_finished: Finished | None = None
        self.last_speedup: float | None = None
        self.last_saved: Path | None = None
        self.last_prefill: Prefill | None = None
        self.answer_steps: list[Step] = []  # the steps of the current (or last) answer, in order
        self._rt_lock = threading.Lock()  # held while a worker uses the runtime; closing waits for it
        # All llama.cpp work runs on this one long-lived thread (Textual's workers only wait for it), so the
        # compute threads llama.cpp spawns from it keep normal priority when the UI thread lowers its own.
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-engine")
        self._cancel = threading.Event()
        self._steps: deque[tuple[Step, float]] = deque()  # filled by the worker, drained by the timer
        self._answer: AnswerView | None = None
        self._live = Stats()
        self._t0 = 0.0
        self._last_step_time = 0.0
        self._painted = (0.0, 0.0)  # (wall clock, UI thread CPU time) at the last frame

    # ---- layout ---------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≫")
        with Horizontal(id="main"):
            yield Transcript(id="transcript")
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield Legend()
        yield PromptInput(placeholder="Loading the model…", id="prompt", disabled=True)
        yield Footer()

    def on_mount(self) -> None:
        self._engine.submit(lambda: None).result()  # start the engine thread before the UI thread yields
        _yield_cpu_to_engine()
        # Between two llama.cpp calls the engine thread needs the GIL back, and a repainting UI thread keeps it
        # for up to the switch interval (5 ms by default, a third of a decoding step): hand it over sooner.
        sys.setswitchinterval(0.0005)
        self.sub_title = "loading the model…"
        self._ticker = self.set_interval(1 / REPAINT_HZ, self._drain, pause=True)
        self.query_one(StatsPanel).show_drafter(self.drafter_choice, None)
        self._open_runtime()

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
        self._engine.submit(self._open_runtime_on_engine).result()

    def _open_runtime_on_engine(self) -> None:
        with self._rt_lock:
            try:
                rt = self._runtime_factory(self.options)
            except UserError as exc:
                self.post_message(RuntimeFailed(str(exc)))
                return
            except Exception as exc:  # a model llama.cpp cannot load must not end the app with a traceback
                self.post_message(RuntimeFailed(f"could not open the model: {type(exc).__name__}: {exc}"))
                return
            self.rt = rt
            self.post_message(RuntimeReady(rt.model_name, rt.chat_template.source, rt.drafter_name, list(rt.notices)))

    def on_runtime_ready(self, message: RuntimeReady) -> None:
        self.ready = True
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
        box = self.prompt_input
        box.placeholder = "Ask something and press Enter  (F1 or ? for help)"
        box.disabled = False
        box.focus()

    def on_runtime_failed(self, message: RuntimeFailed) -> None:
        self.sub_title = "no model"
        self.transcript.add_notice(f"The model could not be opened: {message.error}", severity="error")
        self.transcript.add_notice("Quit with Ctrl+Q and start again with another --model.")
        self.prompt_input.placeholder = "No model: press Ctrl+Q to quit"

    async def on_unmount(self) -> None:
        # Quitting mid-answer: stop the worker at its next step, then free llama.cpp only once it let go.
        self._cancel.set()
        await asyncio.to_thread(self.close_runtime)
        self._engine.shutdown(wait=False)

    def close_runtime(self) -> None:
        """Close the model once no worker uses it (waits for a running answer to notice the cancel flag)."""
        self._cancel.set()
        if not self._rt_lock.acquire(timeout=60):
            return  # a worker is stuck inside llama.cpp; the process exit will reclaim everything
        try:
            if self.rt is not None:
                self.rt.close()
                self.rt = None
        finally:
            self._rt_lock.release()

    # ---- asking ---------------------------------------------------------------------------------------------

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if not self.ready:
            self.notify("The model is not open yet.", severity="warning")
            return
        if self.busy:
            self.notify("An answer is being written: wait, or press Esc to stop it.", severity="warning")
            return
        event.prompt_input.set_text("")
        event.prompt_input.remember(text)
        self.conversation.add_user(text)
        self.transcript.add_user(text)
        self._ask()

    def _count_tokens(self, messages: list[Message]) -> int:
        assert self.rt is not None
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
        self._answer = self.transcript.start_answer(show_ghosts=self.show_ghosts, title="Assistant")
        self._answer.repaint(force=True)  # shows "…" until the first tokens arrive
        self._live = Stats()
        self.answer_steps = []
        self._steps.clear()
        self._cancel.clear()
        self.busy = True
        self.stats_panel.reset()
        self.stats_panel.show_drafter(self.drafter_choice, None)
        self._ticker.resume()
        self.refresh_bindings()
        self._generate(tokens, self.drafter_choice)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, tokens: list[int], drafter: str) -> None:
        worker = get_current_worker()

        def cancelled() -> bool:
            return self._cancel.is_set() or worker.is_cancelled

        self._engine.submit(self._generate_on_engine, tokens, drafter, cancelled).result()

    def _generate_on_engine(self, tokens: list[int], drafter: str, cancelled: Callable[[], bool]) -> None:
        with self._rt_lock:
            rt = self.rt
            if rt is None:
                self.post_message(AnswerFailed("the model is closed"))
                return
            if drafter != rt.drafter_name:
                # opening a draft or early-exit model takes seconds: done here, off the UI thread
                try:
                    rt.set_drafter(drafter)
                    self.post_message(DrafterSwitched(drafter))
                except UserError as exc:
                    self.post_message(DrafterSwitched(rt.drafter_name, str(exc)))
                except Exception as exc:
                    self.post_message(DrafterSwitched(rt.drafter_name, f"{type(exc).__name__}: {exc}"))
            try:
                for event in rt.generator.generate(tokens, self.options.generation, cancelled=cancelled):
                    if isinstance(event, Step):
                        self._steps.append((event, time.perf_counter()))
                    elif isinstance(event, Prefill):
                        self.post_message(Prefilled(event, time.perf_counter()))
                    elif isinstance(event, Finished):
                        plain = rt.generator.chooser.plain_seconds_per_token()
                        self.post_message(AnswerFinished(event, rt.drafter_name, plain))
            except ContextFullError as exc:
                self.post_message(AnswerFailed(str(exc), context_full=True))
            except UserError as exc:
                self.post_message(AnswerFailed(str(exc)))
            except Exception as exc:  # shown in the app: a traceback would wreck the terminal
                self.post_message(AnswerFailed(f"generation failed: {type(exc).__name__}: {exc}"))

    def on_drafter_switched(self, message: DrafterSwitched) -> None:
        if message.error:
            self.transcript.add_notice(f"Drafter unchanged ({message.drafter}): {message.error}", severity="warning")
        self.drafter_choice = message.drafter
        self.stats_panel.show_drafter(message.drafter, None)

    def on_prefilled(self, message: Prefilled) -> None:
        self._t0 = message.decode_started
        p = self.last_prefill = message.prefill
        if self._answer is not None:
            self._answer.border_subtitle = f"prompt {p.prompt_tokens} tokens, {p.new_tokens} new"

    def _over_budget(self) -> bool:
        """True if the UI thread used more than its CPU share since the last frame (then this frame waits)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        last_wall, last_cpu = self._painted
        elapsed = wall - last_wall
        if 0 < elapsed < MIN_FRAME_SECONDS and (cpu - last_cpu) > UI_CPU_BUDGET * elapsed:
            return True
        self._painted = (wall, cpu)
        return False

    def _drain(self, *, final: bool = False) -> None:
        """Timer tick: move the steps the worker queued onto the screen, in one repaint."""
        if not final and self._over_budget():
            return  # the queue keeps the steps; a later frame shows them all at once
        steps: list[Step] = []
        while True:
            try:
                step, stamp = self._steps.popleft()
            except IndexError:
                break
            steps.append(step)
            self._last_step_time = stamp
        answer = self._answer
        if answer is None:
            return
        now = time.perf_counter()
        self.answer_steps.extend(steps)
        for step in steps:
            answer.add_step(step, now)
            self._live.add_step(step)
        answer.drop_ghosts(now)
        answer.repaint()
        if steps:
            last = steps[-1]
            panel = self.stats_panel
            label = self.drafter_choice if last.drafter in (self.drafter_choice, "none") else (
                f"{self.drafter_choice} → {last.drafter}"
            )
            panel.show_drafter(label, last.k)
            panel.add_lengths(steps)
            panel.show_stats(self._live, max(self._last_step_time - self._t0, 1e-9))

    def on_answer_finished(self, message: AnswerFinished) -> None:
        self._drain(final=True)
        finished = message.finished
        stats = finished.stats
        answer = self._answer
        self._end_generation()
        if answer is not None:
            answer.add_text(finished.tail)
            answer.drop_ghosts()
            answer.repaint()
            answer.border_subtitle = answer_summary(stats, message.drafter)
            self.conversation.add_assistant(answer.text, stats, message.drafter, finished.reason)
        self.last_finished = finished
        panel = self.stats_panel
        panel.show_stats(stats, stats.decode_seconds)
        # speedup: what target-only decoding would have taken (measured cost of one plain step × tokens) over
        # what this answer took
        plain = message.plain_seconds_per_token
        if plain > 0 and stats.decode_seconds > 0 and stats.generated_tokens:
            self.last_speedup = stats.generated_tokens * plain / stats.decode_seconds
            panel.show_speedup(self.last_speedup, f"est. from {plain * 1000:.1f} ms per plain step")
        else:
            self.last_speedup = None
            panel.show_speedup(None, "speedup  — (no plain step measured yet)")
        if finished.reason == "interrupted":
            self.transcript.add_notice("Stopped. The partial answer stays in the conversation.")
        elif finished.reason == "length":
            self.transcript.add_notice(
                f"The answer reached --max-tokens ({self.options.generation.max_tokens}); ask it to continue."
            )
        elif finished.reason == "context_full":
            self._offer_context_choice("The answer filled the context window (--ctx) and stopped.")

    def on_answer_failed(self, message: AnswerFailed) -> None:
        self._drain()
        self._end_generation()
        if self._answer is not None and not self._answer.text:
            self._answer.remove()
        self._answer = None
        if message.context_full:
            self._offer_context_choice(message.error)
        else:
            self.transcript.add_notice(message.error, severity="error")

    def _end_generation(self) -> None:
        self.busy = False
        self._ticker.pause()
        self.refresh_bindings()
        self.prompt_input.focus()

    # ---- a full context --------------------------------------------------------------------------------------

    def _offer_context_choice(self, detail: str) -> None:
        def chosen(choice: str | None) -> None:
            self._context_choice(choice or "keep")

        self.push_screen(ContextFullScreen(detail), chosen)

    def _context_choice(self, choice: str) -> None:
        pending = bool(self.conversation.turns) and self.conversation.turns[-1].role == "user"
        if choice == "start-over":
            question = self.conversation.turns[-1].text if pending else None
            self._clear()
            if question is not None:
                self.conversation.add_user(question)
                self.transcript.add_user(question)
                self._ask()
        elif choice == "drop-oldest":
            n_ctx = self.options.runtime.n_ctx
            # leave room for an answer: up to --max-tokens, but never more than half the context
            budget = n_ctx - min(self.options.generation.max_tokens, n_ctx // 2)
            dropped = self.conversation.fit(self._count_tokens, budget)
            self.transcript.add_notice(
                f"Dropped the {dropped} oldest exchange(s) from the model's context (still shown above)."
                if dropped else "There is no older exchange to drop."
            )
            if pending and (dropped or self._count_tokens(self.conversation.messages()) < n_ctx):
                self._ask()
        else:
            self.transcript.add_notice("The context is full: Ctrl+L starts over.", severity="warning")

    # ---- keys ------------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        on_main = len(self.screen_stack) == 1
        if action == "stop":
            return True if self.busy else None  # shown dimmed while there is nothing to stop
        if action in ("cycle_drafter", "toggle_ghosts", "clear", "save"):
            return on_main
        return True

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        if len(self.screen_stack) > 1:
            return
        self.push_screen(HelpScreen())

    def action_stop(self) -> None:
        if self.busy:
            self._cancel.set()

    def action_cycle_drafter(self) -> None:
        cycle = [d for d in DRAFTER_CYCLE if d != "draft" or self.options.speculation.draft_model]
        current = self.drafter_choice if self.drafter_choice in cycle else cycle[-1]
        self.drafter_choice = cycle[(cycle.index(current) + 1) % len(cycle)]
        active = self.rt.drafter_name if self.rt is not None else self.drafter_choice
        self.stats_panel.show_drafter(active, None, pending=self.drafter_choice)
        self.notify(f"Drafter for the next answer: {self.drafter_choice}", timeout=2)

    def action_toggle_ghosts(self) -> None:
        self.show_ghosts = not self.show_ghosts
        self.query_one(Legend).set_ghosts(self.show_ghosts)
        if self._answer is not None:
            self._answer.show_ghosts = self.show_ghosts
            if not self.show_ghosts:
                self._answer.drop_ghosts()
                self._answer.repaint()

    def action_clear(self) -> None:
        if self.busy:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self._clear()
        self.notify("Conversation cleared.", timeout=2)

    def _clear(self) -> None:
        # the model's cache needs no reset: the next prompt shares only its opening with the old one, and the
        # generator re-uses exactly the common prefix
        self.conversation.clear()
        self.transcript.remove_children()
        self._answer = None
        self.stats_panel.reset()

    def action_save(self) -> None:
        name = f"localspec-chat-{datetime.now():%Y%m%d-%H%M%S}.md"
        path = self.save_dir / name
        model = self.rt.model_name if self.rt is not None else "no model"
        try:
            path.write_text(self.conversation.to_markdown(model), encoding="utf-8")
        except OSError as exc:
            self.notify(f"Could not save {path}: {exc.strerror or exc}", severity="error")
            return
        self.last_saved = path
        self.notify(f"Saved {path}", timeout=4)

    async def action_quit(self) -> None:
        self._cancel.set()  # the worker stops at its next step; on_unmount waits for it before closing
        self.exit()


def _yield_cpu_to_engine() -> None:
    """Lower the UI thread's priority (Linux: per thread), so that repainting never takes a core from llama.cpp.

    llama.cpp's compute threads wait for each other at every step of a pass: when the UI thread takes one of
    their cores, even briefly, the whole pass stalls (measured on 2 cores: the chat decoded at ~60% of `run`'s
    speed). At lower priority the UI repaints in the gaps instead. Threads started later inherit it, which is why
    llama.cpp only ever runs on the engine thread, started before this.
    """
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), 10))
        except OSError:
            pass
