"""The chat's engine: the chat's side of the worker thread, and the frame budget that keeps the UI off its cores.

All llama.cpp work (loading, every answer) runs on one long-lived thread, a ``localspec.worker.Worker`` (the server
uses one too): a second calling thread would start a second OpenMP team in the process, and the two slow each other
down. The engine adapts what the worker does to Textual: it never touches a widget, it
appends each Step to a deque and posts a handful of messages (ready, prefilled, finished, failed); a timer on the
UI thread takes the steps and repaints, skipping frames past a small CPU budget. Per-token ``call_from_thread``
would block the generator until the UI had caught up, and a repaint per token would steal CPU from llama.cpp.

It builds on the events of the speculation loop only (``Runtime.generate`` → Prefill | Step | Finished) and on
the Runtime's façade (``open``, ``set_drafter``, ``plain_seconds_per_token``); it does not reach into the loop.
The answer loop (events → deque and messages) stays here rather than in worker.py behind callbacks: the server's
worker runs the scheduler, whose events go to each request's handler, and ``run`` reads events on its own thread,
so such a layer would have this one user.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from localspec.errors import ContextFullError, UserError
from localspec.events import Finished, Prefill, Step
from localspec.tui.messages import (
    AnswerFailed,
    AnswerFinished,
    DrafterSwitched,
    Prefilled,
    RuntimeFailed,
    RuntimeLoading,
    RuntimeReady,
)
from localspec.worker import Worker

if TYPE_CHECKING:
    from textual.message import Message

    from localspec.runtime import Runtime
    from localspec.settings import Settings

T = TypeVar("T")

REPAINT_HZ = 30  # repaints per second while an answer streams: smooth to the eye, cheap for the CPU
# Share of one core the UI may spend while an answer streams. On a small machine every millisecond the UI takes
# stalls llama.cpp's threads (they wait for each other at each step), costing about twice that in decoding speed:
# past this budget frames are skipped (steps still accumulate) and the frame rate drops instead. Measured on 2
# cores, 512-token answers: no painting during the answer 97% of `run`'s tok/s, 8% budget 85%, 2.5% ~parity.
UI_CPU_BUDGET = 0.025
MIN_FRAME_SECONDS = 0.5  # whatever the budget, the answer moves at least this often
# an instruction-tuned model in models.toml to suggest when a base model of this architecture is opened
INSTRUCT_BY_ARCH = {"gemma3": "gemma3-270m-it"}


def open_runtime(options: Settings, say: Callable[[str], None] | None = None) -> Runtime:
    from localspec.runtime import Runtime

    return Runtime.open(options, say=say)


class Engine:
    """Owns the runtime and the thread that uses it. ``post`` delivers messages to the app (thread-safe)."""

    def __init__(
        self,
        options: Settings,
        post: Callable[[Message], Any],
        runtime_factory: Callable[[Settings], Runtime] | None = None,
    ) -> None:
        self.options = options
        self._post = post
        # what the first start measures (a few seconds, once per machine) is said in the chat, not on a hidden stderr
        self._runtime_factory = runtime_factory or (
            lambda settings: open_runtime(settings, say=lambda text: post(RuntimeLoading(text))))
        self.rt: Runtime | None = None
        self._lock = threading.Lock()  # held while the engine uses the runtime; closing waits for it
        # Textual's workers only wait for this thread, so the compute threads llama.cpp spawns from it keep normal
        # priority when the UI thread lowers its own.
        self.worker = Worker("localspec-engine")
        self.stop_requested = self.worker.stop_requested
        self.steps: deque[tuple[Step, float]] = deque()  # filled by the engine, taken by the UI's timer
        self.closing: list[str] = []  # what closing the runtime said (a failed save), printed once the app is gone

    def start(self) -> None:
        """Start the engine thread, then lower the priority of the calling (UI) thread only."""
        self.call(lambda: None)
        _yield_cpu_to_engine()
        # Between two llama.cpp calls the engine thread needs the GIL back, and a repainting UI thread keeps it
        # for up to the switch interval (5 ms by default, a third of a decoding step): hand it over sooner.
        sys.setswitchinterval(0.0005)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the engine thread and wait for it (from a worker thread: it blocks)."""
        return self.worker.call(fn, *args)

    # ---- opening and closing ---------------------------------------------------------------------------------

    def open(self) -> None:
        self.call(self._open)

    def _open(self) -> None:
        with self._lock:
            try:
                rt = self._runtime_factory(self.options)
            except UserError as exc:
                self._post(RuntimeFailed(str(exc)))
                return
            except Exception as exc:  # a model llama.cpp cannot load must not end the app with a traceback
                self._post(RuntimeFailed(f"could not open the model: {type(exc).__name__}: {exc}"))
                return
            self.rt = rt
            advice = [base_model_advice(rt)] if is_base_model(rt) else []
            self._post(RuntimeReady(rt.model_name, rt.chat_template.source, rt.drafter_name, advice + rt.notices))

    def close(self) -> None:
        """Close the model once nothing uses it (waits for a running answer to notice the stop flag). What closing
        has to say (a history that could not be saved) is kept in ``closing``, for after the app has left the
        terminal."""
        self.stop_requested.set()
        if not self._lock.acquire(timeout=60):
            return  # the engine is stuck inside llama.cpp; the process exit will reclaim everything
        try:
            if self.rt is not None:
                self.rt.say = self.closing.append
                self.rt.close()
                self.rt = None
        finally:
            self._lock.release()

    def shutdown(self) -> None:
        self.worker.shutdown(wait=False)

    # ---- answering -------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """Before an answer: no stale steps, no stale stop request."""
        self.steps.clear()
        self.stop_requested.clear()

    def generate(self, tokens: list[int], drafter: str, cancelled: Callable[[], bool], conversation: int = 0,
                 prediction: str | None = None) -> None:
        """Answer ``tokens`` with ``drafter`` (switched first if needed); blocks until the answer ends. What it
        feeds the history is ``conversation``'s (its id in the store; 0: not saved), to forget when it is deleted.
        ``prediction``: what the answer will mostly be (/predict: the last answer), drafted from."""
        self.call(self._generate, tokens, drafter, lambda: self.stop_requested.is_set() or cancelled(), conversation,
                  prediction)

    def forget(self, conversation: int) -> None:
        """A deleted conversation's turns leave the history too: the runtime's (which would save them back) and
        every file's."""
        self.call(self._forget, conversation)

    def _forget(self, conversation: int) -> None:
        from localspec.history.history import forget_everywhere

        with self._lock:
            history = getattr(self.rt, "history", None)
            try:
                if history is not None:
                    history.forget(conversation)
                forget_everywhere(conversation)
            except OSError as exc:  # said in the chat, never a traceback
                self._post(RuntimeLoading(f"the history could not forget conversation {conversation}: "
                                          f"{exc.strerror or type(exc).__name__}"))

    def _generate(self, tokens: list[int], drafter: str, cancelled: Callable[[], bool], conversation: int = 0,
                  prediction: str | None = None) -> None:
        with self._lock:
            rt = self.rt
            if rt is None:
                self._post(AnswerFailed("the model is closed"))
                return
            if hasattr(rt, "tag_history"):
                rt.tag_history(conversation)
            if drafter != rt.drafter_name:
                # opening a draft or early-exit model takes seconds: done here, off the UI thread
                try:
                    rt.set_drafter(drafter)
                    self._post(DrafterSwitched(drafter))
                except UserError as exc:
                    self._post(DrafterSwitched(rt.drafter_name, str(exc)))
                except Exception as exc:
                    self._post(DrafterSwitched(rt.drafter_name, f"{type(exc).__name__}: {exc}"))
            try:
                generation = self.options.generation
                if prediction:
                    try:
                        generation = replace(generation, prediction=rt.prediction_tokens(prediction))
                    except UserError:  # an answer past a prediction's bound: this one is answered without it
                        self._post(RuntimeLoading("the last answer is too long to predict the next one from: this "
                                                  "answer is drafted as any other"))
                for event in rt.generate(tokens, generation, cancelled=cancelled):
                    if isinstance(event, Step):
                        event.decode_rejected()  # shown as ghosts: decoded here, where the model runs, not on the UI
                        self.steps.append((event, time.perf_counter()))
                    elif isinstance(event, Prefill):
                        self._post(Prefilled(event, time.perf_counter()))
                    elif isinstance(event, Finished):
                        plain = rt.plain_seconds_per_token()
                        self._post(AnswerFinished(event, rt.drafter_name, plain))
            except ContextFullError as exc:
                self._post(AnswerFailed(str(exc), context_full=True))
            except UserError as exc:
                self._post(AnswerFailed(str(exc)))
            except Exception as exc:  # shown in the app: a traceback would wreck the terminal
                self._post(AnswerFailed(f"generation failed: {type(exc).__name__}: {exc}"))

    def take_steps(self) -> tuple[list[Step], float]:
        """The steps queued since the last call, and the engine's clock at the last of them (0: none)."""
        steps: list[Step] = []
        stamp = 0.0
        while True:
            try:
                step, stamp = self.steps.popleft()
            except IndexError:
                return steps, stamp
            steps.append(step)


def is_base_model(rt: Runtime) -> bool:
    """Neither a chat template in the file nor an instruction-tuned name: a base model, which continues text."""
    finetune = (rt.model.meta("general.finetune") or "").lower()
    return rt.chat_template.source != "model" and not re.search(r"\b(it|instruct|chat)\b", finetune)


def base_model_advice(rt: Runtime) -> str:
    tip = INSTRUCT_BY_ARCH.get(rt.model.architecture or "")
    how = (f"`localspec pull {tip}`, then `localspec chat --model {tip}`" if tip
           else "pick an instruction-tuned model from `localspec models`")  # fmt: skip
    return (f"{rt.model_name} is a base model, not tuned to follow instructions: it continues text, and as a chat"
            f" partner it rambles. For a model that answers: {how}.")


class FrameBudget:
    """Whether the UI thread may paint a frame now: not while it used more than its CPU share since the last."""

    def __init__(self, share: float = UI_CPU_BUDGET, min_seconds: float = MIN_FRAME_SECONDS) -> None:
        self.share = share
        self.min_seconds = min_seconds
        self._painted = (0.0, 0.0)  # (wall clock, UI thread CPU time) at the last frame

    def skip(self) -> bool:
        wall, cpu = time.perf_counter(), time.thread_time()
        last_wall, last_cpu = self._painted
        elapsed = wall - last_wall
        if 0 < elapsed < self.min_seconds and (cpu - last_cpu) > self.share * elapsed:
            return True
        self._painted = (wall, cpu)
        return False


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
