"""The chat app, driven through Textual's Pilot with the real embedded model (no mocks).

Answers are greedy and short (≤ 48 tokens) so each test costs a model load (~1 s) and a few seconds of decoding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("textual")

from textual.pilot import Pilot  # noqa: E402
from textual.widgets import Sparkline, Static  # noqa: E402

from localspec.cli.options import build_options
from localspec.events import Finished, Step  # noqa: E402
from localspec.settings import Settings  # noqa: E402
from localspec.tui.app import ChatApp  # noqa: E402
from localspec.tui.conversation import Conversation  # noqa: E402
from localspec.tui.screens import ConfirmScreen, ContextFullScreen, HelpScreen  # noqa: E402
from localspec.tui.widgets import ACCEPTED_STYLE, GHOST_STYLE, AnswerView, StatsPanel  # noqa: E402
from tests.lossless import assert_lossless, margin  # noqa: E402

# Repetition the n-gram drafter can draft from: its drafts get accepted, so accepted-draft styling shows up.
REPEAT_PROMPT = "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
SIZE = (110, 36)




def options(model: Path | str, **overrides: Any) -> Settings:
    given: dict[str, Any] = dict(drafter="ngram", k=4, max_tokens=40, seed=0, ctx=2048, gpu_layers=0)
    return build_options(model=str(model), **(given | overrides))


async def until(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Let the app run until ``condition`` holds (the worker thread decodes meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for the app")
        await pilot.pause(0.05)


def drive(app: ChatApp, body: Callable[[Pilot[ChatApp]], Awaitable[None]], size: tuple[int, int] = SIZE) -> None:
    """Run ``app`` headless in a terminal of ``size``, with ``body`` driving it as a person would (a Pilot)."""

    async def scenario() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot)

    asyncio.run(scenario())


async def ask(pilot: Pilot[ChatApp], text: str) -> Finished:
    """Type a message as a person would, send it with Enter, and wait for the answer to finish."""
    app = pilot.app
    await until(pilot, lambda: app.ready)
    before = app.last_finished
    await pilot.press(*text)
    await pilot.press("enter")
    await until(pilot, lambda: app.last_finished is not before and not app.busy)
    assert app.last_finished is not None
    return app.last_finished


def test_answer_streams_with_accepted_drafts_styled(model_path: Path) -> None:
    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        assert "built-in 'gemma'" in app.sub_title  # the model has no template: the header says so
        finished = await ask(pilot, REPEAT_PROMPT)
        answer = app.query(AnswerView).last()

        # the transcript holds the question and the generated text, and so does the conversation
        assert app.query(".user").last().render().plain == REPEAT_PROMPT  # type: ignore[union-attr]
        steps = app.answer_steps
        generated = "".join(t.text for s in steps for t in s.emitted) + finished.tail
        assert answer.text == generated and generated.strip()
        assert app.conversation.turns[-1].role == "assistant"
        assert app.conversation.turns[-1].text == generated
        assert finished.stats.generated_tokens == sum(len(s.emitted) for s in steps)

        # accepted draft tokens carry the accepted style, the target's own tokens do not
        accepted_text = "".join(t.text for s in steps for t in s.accepted)
        assert accepted_text, "the n-gram drafter should have had drafts accepted on a repeating prompt"
        content = answer.content()
        styled = "".join(content.plain[sp.start:sp.end] for sp in content.spans if sp.style == ACCEPTED_STYLE)
        assert styled == accepted_text
        # ghosts are gone once the answer is done
        assert not [sp for sp in content.spans if sp.style == GHOST_STYLE]
        assert all(r.kind != "ghost" for r in answer.runs)

        # the stats panel has the answer's numbers and a speedup estimate
        panel = app.query_one(StatsPanel)
        assert "tok/s" in str(panel.query_one("#rates", Static).render())
        assert list(panel.query_one("#spark", Sparkline).data or []) == [len(s.emitted) for s in steps]
        assert app.last_speedup is not None and app.last_speedup > 0

        # lossless: every position of the answer is the target's greedy choice, within this device's margin
        rt = app.rt
        assert rt is not None
        tokens = app._tokens(app.conversation.messages()[:-1])
        drafted = [t.id for s in steps for t in s.emitted]
        # on the app's engine thread, like all llama.cpp work (the context warns otherwise)
        app.engine.call(lambda: assert_lossless(rt.model, tokens, drafted, margin(rt.model)))

    drive(app, body)


def test_ghosts_appear_while_streaming_and_can_be_hidden(model_path: Path) -> None:
    """Rejected drafts are shown (briefly) where they were rejected; Ctrl+G hides them."""
    from localspec.events import Token

    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        view = AnswerView(show_ghosts=True, ghost_seconds=10.0)
        step = Step((Token(1, " a", "draft"),), (Token(2, " x", "draft"), Token(3, " y", "draft")),
                    Token(4, " b", "target"), "ngram", 3, 0.0, 0.0)
        view.add_step(step, now=0.0)
        assert [(r.text, r.kind) for r in view.runs] == [(" a", "draft"), (" x y", "ghost"), (" b", "target")]
        assert view.text == " a b"
        view.drop_ghosts(now=5.0)
        assert len(view.runs) == 3  # not yet expired
        view.drop_ghosts(now=11.0)
        assert [(r.text, r.kind) for r in view.runs] == [(" a", "draft"), (" b", "target")]

        await pilot.press("ctrl+g")
        assert app.show_ghosts is False
        assert "hidden" in str(app.query_one("#legend", Static).render())
        await pilot.press("ctrl+g")
        assert app.show_ghosts is True

    drive(app, body)


def test_a_token_tree_shows_its_losing_branches_as_rejected_alternatives(model_path: Path) -> None:
    """A pass that verified a token tree: the winning branch's accepted tokens are green, its rejected rest a ghost,
    each losing branch a ghost of its own in brackets; the stats panel counts branches per tree pass."""
    from localspec.events import Token
    from localspec.tui.live import LiveAnswer
    from localspec.tui.widgets import BRANCH_MARK_STYLE

    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        # the app's own path for an answer's steps: the engine's queue, drained by the UI timer into the live answer
        view = app.transcript.start_answer(show_ghosts=True, title="Assistant")
        view.ghost_seconds = 60.0  # long enough for the assertions below
        app._live = LiveAnswer(view, app.stats_panel, "ngram")
        await pilot.pause()

        def t(i: int, text: str) -> Token:
            return Token(i, text, "draft")

        tree = Step((t(1, " the"), t(2, " cat")), (t(3, " ran"),), Token(4, " sat", "target"), "ngram", 7, 0.0, 0.0,
                    rejected_branches=((t(5, " dog"), t(6, " barked")), (t(7, " mat"),)), branches=3)
        chain = Step((t(8, " on"),), (), Token(9, " the", "target"), "ngram", 1, 0.0, 0.0)
        app.engine.steps.extend([(tree, 1.0), (chain, 2.0)])
        app._drain(final=True)
        await pilot.pause()

        assert view.text == " the cat sat on the"  # what the model wrote: no ghost, no branch in it
        content = view.content()
        # shown in order: the winning branch, its rejected rest, each losing branch in brackets, the target's token
        assert content.plain == " the cat ran[ dog barked][ mat] sat on the"
        styled = {content.plain[sp.start:sp.end]: sp.style for sp in content.spans}
        assert styled[" the cat"] == ACCEPTED_STYLE and styled[" on"] == ACCEPTED_STYLE
        assert styled[" ran"] == GHOST_STYLE  # the winning branch's rejected tail, as today
        assert styled[" dog barked"] == GHOST_STYLE and styled[" mat"] == GHOST_STYLE  # the losing branches
        assert [sp.style for sp in content.spans if content.plain[sp.start:sp.end] in "[]"] == [BRANCH_MARK_STYLE] * 4
        assert "[ dog barked][ mat]" in str(view.query_one(Static).render())  # on screen

        rates = str(app.query_one(StatsPanel).query_one("#rates", Static).render())
        assert "length   2.50 tokens/pass" in rates  # 5 tokens in 2 passes
        assert "branches 3.0 per tree, 1 tree" in rates

        # rejected drafts hidden: losing branches too
        await pilot.press("ctrl+g")
        assert view.content().plain == " the cat sat on the"
        hidden = Step((), (t(10, " x"),), Token(11, " y", "target"), "ngram", 2, 0.0, 0.0,
                      rejected_branches=((t(12, " z"),),), branches=2)
        view.add_step(hidden, now=0.0)
        assert view.content().plain == " the cat sat on the y"

    drive(app, body)


def test_escape_stops_a_long_answer(model_path: Path) -> None:
    app = ChatApp(options(model_path, drafter="none", k=None, max_tokens=2000))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        await pilot.press(*"Write a very long story about a dragon.")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.answer_steps) >= 3)
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy, timeout=20)
        finished = app.last_finished
        assert finished is not None and finished.reason == "interrupted"
        assert 3 <= finished.stats.generated_tokens < 2000
        # the partial answer stays, on screen and in the conversation
        answer = app.query(AnswerView).last()
        assert answer.text and app.conversation.turns[-1].text == answer.text
        assert any("Stopped" in str(n.render()) for n in app.query(".notice"))
        # and the app takes the next question
        assert app.prompt_input.has_focus and not app.prompt_input.disabled

    drive(app, body)


def test_drafter_key_changes_the_drafter_for_the_next_answer(model_path: Path) -> None:
    app = ChatApp(options(model_path, drafter="none", k=None, max_tokens=12))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        assert app.drafter_choice == "none"
        await pilot.press("f2")
        assert app.drafter_choice == "ngram"
        assert "next     ngram" in str(app.query_one("#drafter", Static).render())
        await ask(pilot, "Say hello.")
        assert app.rt is not None and app.rt.drafter_name == "ngram"
        assert app.conversation.turns[-1].drafter == "ngram"
        # the cycle skips `draft` when no --draft model was given: ngram → early-exit → layer-skip → auto → none
        await pilot.press("f2")
        assert app.drafter_choice == "early-exit"
        await pilot.press("f2")
        assert app.drafter_choice == "layer-skip"
        await pilot.press("f2", "f2")
        assert app.drafter_choice == "none"

    drive(app, body)


def test_follow_up_reuses_the_cache_and_saves_markdown(model_path: Path, tmp_path: Path) -> None:
    app = ChatApp(options(model_path, max_tokens=16), save_dir=tmp_path, system="Answer briefly.")

    async def body(pilot: Pilot[ChatApp]) -> None:
        await ask(pilot, "Name a colour.")
        first = app.last_prefill
        await ask(pilot, "Name another one.")
        second = app.last_prefill
        assert first is not None and second is not None
        # only the new turn (plus whatever the re-rendered answer changed) is prefilled
        assert second.prompt_tokens > first.prompt_tokens
        assert second.new_tokens < second.prompt_tokens - first.prompt_tokens + 8
        assert [t.role for t in app.conversation.turns] == ["user", "assistant", "user", "assistant"]

        await pilot.press("ctrl+s")
        assert app.last_saved is not None and app.last_saved.parent == tmp_path
        saved = app.last_saved.read_text(encoding="utf-8")
        assert "## You\n\nName a colour." in saved and "## System\n\nAnswer briefly." in saved
        assert app.conversation.turns[-1].text.strip() in saved

        # Ctrl+L asks first: Esc keeps the conversation, y clears it
        await pilot.press("ctrl+l")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")
        assert len(app.conversation.turns) == 4 and app.query(AnswerView)
        await pilot.press("ctrl+l", "y")
        assert app.conversation.turns == [] and not app.query(AnswerView)

    drive(app, body)


def test_help_opens_with_question_mark_only_when_the_input_is_empty(model_path: Path) -> None:
    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("w", "h", "y", "question_mark")
        assert app.prompt_input.text == "why?"
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert not isinstance(app.screen, HelpScreen)

    drive(app, body)


def test_a_model_that_fails_to_load_is_a_notice(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)

    app = ChatApp(options(broken))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: bool(app.query(".notice.error")))
        notice = str(app.query(".notice.error").first().render())
        assert "could not be opened" in notice
        assert not app.ready and app.prompt_input.disabled
        await pilot.press("ctrl+q")

    drive(app, body)
    assert app.return_code == 0


def test_a_full_context_offers_to_drop_the_oldest_turns(model_path: Path) -> None:
    app = ChatApp(options(model_path, ctx=88, max_tokens=48))

    async def body(pilot: Pilot[ChatApp]) -> None:
        first = await ask(pilot, REPEAT_PROMPT)  # 33 prompt tokens + 48 answered: the next turn cannot fit
        assert first.reason == "length", "the test needs a first answer that runs to --max-tokens"
        await pilot.press(*"And again?")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ContextFullScreen))
        await pilot.press("d")
        await until(pilot, lambda: not isinstance(app.screen, ContextFullScreen))
        await until(pilot, lambda: not app.busy and app.conversation.turns[-1].role == "assistant")
        # the first exchange left the model's context; the question got an answer
        assert [t.text for t in app.conversation.turns if t.role == "user"] == ["And again?"]
        assert any("Dropped the 1 oldest" in str(n.render()) for n in app.query(".notice"))

    drive(app, body)


def test_conversation_fit_and_markdown() -> None:
    conv = Conversation(system="Be brief.")
    for i in range(3):
        conv.add_user(f"q{i}")
        conv.add_assistant(f"a{i}")
    conv.add_user("last")

    def count(messages: list[Any]) -> int:
        return sum(len(m.content) for m in messages)

    dropped = conv.fit(count, budget=len("Be brief.") + len("q2a2last"))
    assert dropped == 2 and [t.text for t in conv.turns] == ["q2", "a2", "last"]
    assert conv.messages()[0].role == "system"
    assert not Conversation(turns=[]).drop_oldest()
    md = conv.to_markdown("m")
    assert md.startswith("# localspec chat — m") and "## Assistant\n\na2" in md


# ---- snapshots ------------------------------------------------------------------------------------------------

def _mask_timings(app: ChatApp) -> None:
    """Replace the numbers that depend on the machine's speed, so the snapshot is about layout and styling."""
    panel = app.query_one(StatsPanel)
    rates = str(panel.query_one("#rates", Static).render()).splitlines()
    panel.query_one("#rates", Static).update("\n".join(["tok/s    (masked)", *rates[1:]]))
    panel.query_one("#speedup", Static).update("speedup  (masked)")
    for view in app.query(AnswerView):
        view.set_summary("(stats masked)")
    app.prompt_input.cursor_blink = False  # a blinking cursor is on or off depending on when the shot is taken


def test_snapshot_ready(model_path: Path, snap_compare: Any) -> None:
    app = ChatApp(options(model_path))

    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.ready)
        app.prompt_input.cursor_blink = False  # on or off depending on when the shot is taken

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_snapshot_after_a_greedy_answer(model_path: Path, snap_compare: Any) -> None:
    # k fixed and one chain: with adaptive k, or token trees (whose shape the policy picks from measured pass
    # costs), the split between accepted and target tokens would depend on measured timings
    # 21 tokens: the three sentences the model repeats, not the near-tie after them (which CPUs break apart)
    app = ChatApp(options(model_path, k=4, branches=1, max_tokens=21))

    async def run_before(pilot: Pilot[Any]) -> None:
        await ask(pilot, REPEAT_PROMPT)
        _mask_timings(app)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_a_long_answer_keeps_only_its_tail_live(model_path: Path) -> None:
    """Finished lines of a long answer move into parts rendered once; text, styles and order are unchanged."""
    from localspec.events import Token

    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        view = app.transcript.start_answer(show_ghosts=True, title="Assistant")
        await pilot.pause()  # composed: parts are mounted before its live tail
        expected = ""
        for i in range(120):
            line = f"line {i} of a long answer\n"
            source = "draft" if i % 2 else "target"
            step = Step((Token(i, line, "draft"),) if source == "draft" else (), (),
                        Token(i, line, "target") if source == "target" else None, "ngram", 1, 0.0, 0.0)
            view.add_step(step, now=0.0)
            view.repaint()
            await pilot.pause()
            expected += line
        await pilot.pause()
        parts = view.query(Static)
        assert len(parts) > 3  # frozen parts + the live tail
        assert view.text == expected
        assert view.content().plain == expected
        assert sum(len(r.text) for r in view._runs) <= AnswerView.FREEZE_CHARS + 40
        shown = "\n".join(str(p.render()) for p in parts if p.display)
        assert shown.replace("\n", "") == expected.replace("\n", "")

    drive(app, body)


# ---- without a model: what the panels and notices say -------------------------------------------------------

def no_model(settings: Settings) -> Any:
    """A runtime factory for tests that need the app's widgets but no model: the app shows 'no model'."""
    from localspec.errors import UserError

    raise UserError("no model in this test")


def screen_text(app: ChatApp, widget: Any) -> str:
    """What the terminal shows where ``widget`` is (its border included), line by line."""
    region = widget.region  # its top may be scrolled out of sight (y < 0): a negative index would count from the end
    strips = app.screen._compositor.render_strips()
    return "\n".join(strip.crop(region.x, region.right).text for strip in strips[max(region.y, 0):region.bottom])


def test_the_speedup_is_an_estimate_never_above_the_tokens_per_pass(tmp_path: Path) -> None:
    """13 tokens in 10 passes cannot be more than 1.3x faster than target-only decoding, whatever a plain step was
    measured to cost (a busy machine once gave 25x): the figure is capped there, and says so."""
    from localspec.events import Stats
    from localspec.tui.live import LiveAnswer

    app = ChatApp(options(tmp_path / "none.gguf"), runtime_factory=no_model)
    stats = Stats(generated_tokens=13, target_passes=10, decode_seconds=0.52, drafted=6, accepted=3,
                  stop_reason="eog")

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: bool(app.query(".notice.error")))
        panel = app.query_one(StatsPanel).query_one("#speedup", Static)
        for plain, shown, capped in ((1.0, "≤ 1.30×", True), (0.03, "0.75×", False)):
            live = LiveAnswer(app.transcript.start_answer(show_ghosts=True, title="Assistant"), app.stats_panel, "x")
            speedup = live.finish(Finished("eog", stats), "ngram", plain)
            await pilot.pause()
            text = str(panel.render())
            assert shown in text and "est." in text and ("capped" in text) == capped, text
            assert speedup == pytest.approx(min(13 * plain / 0.52, 1.3))
        assert "25.00×" not in text

    drive(app, body)


def test_the_speedup_of_an_answer_that_drafted_nothing_is_one_and_else_prices_its_own_plain_passes() -> None:
    # a code rename that drafted nothing showed 0.91x: the calibration's plain step, measured apart from the chat's
    # own work, against an answer that ran target-only's very passes
    from localspec.events import Stats
    from localspec.tui.speedup import estimate_speedup

    nothing = Stats(generated_tokens=20, target_passes=20, decode_seconds=0.55, plain_passes=20, plain_seconds=0.5)
    estimate = estimate_speedup(nothing, 0.025)
    assert estimate is not None and estimate.shown == 1.0 and estimate.source == "nothing drafted"
    # drafted: target-only's step is what this answer's own one-row passes cost (10 ms), not the calibration's 25
    drafted = Stats(generated_tokens=30, target_passes=15, decode_seconds=0.3, drafted=20, accepted=15,
                    plain_passes=5, plain_seconds=0.05)
    estimate = estimate_speedup(drafted, 0.025)
    assert estimate is not None and estimate.source == "answer" and estimate.shown == pytest.approx(30 * 0.01 / 0.3)
    # too few of its own: the calibration's
    few = Stats(generated_tokens=30, target_passes=15, decode_seconds=0.3, drafted=20, accepted=15, plain_passes=2,
                plain_seconds=0.02)
    estimate = estimate_speedup(few, 0.025)
    assert estimate is not None and estimate.source == "calibration" and estimate.plain_seconds == 0.025


def test_the_stats_line_under_an_answer_is_shown_whole_at_120_columns(tmp_path: Path) -> None:
    from localspec.events import Stats
    from localspec.tui.conversation import answer_summary
    from localspec.tui.live import LiveAnswer

    app = ChatApp(options(tmp_path / "none.gguf"), runtime_factory=no_model)
    stats = Stats(generated_tokens=1024, target_passes=412, decode_seconds=27.5, drafted=1480, accepted=1002,
                  tree_passes=120, branches=310, stop_reason="length",
                  cache_drafted=300, cache_accepted=250)  # fmt: skip

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: bool(app.query(".notice.error")))
        view = app.transcript.start_answer(show_ghosts=True, title="Assistant")
        live = LiveAnswer(view, app.stats_panel, "auto")
        live.finish(Finished("length", stats), "auto", 0.02)
        await pilot.pause()
        summary = answer_summary(stats, "auto")
        assert "250/300 from earlier requests" in summary  # drafts copied from the history, under the answer ...
        rates = str(app.stats_panel.query_one("#rates", Static).render())
        assert "history  250/300 accepted" in rates  # ... and in the panel
        assert len(summary) > 80  # longer than the answer is wide
        shown = screen_text(app, view)
        words = "".join(c for c in shown if not c.isspace() and c not in "│─╭╮╰╯")
        assert "".join(summary.split()) in words, shown

    drive(app, body, size=(120, 36))


def test_ctrl_s_says_the_full_path_of_the_transcript(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    app = ChatApp(options(tmp_path / "none.gguf"), runtime_factory=no_model, save_dir=Path("out"))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: bool(app.query(".notice.error")))
        await pilot.press("ctrl+s")
        saved = app.last_saved
        assert saved is not None and saved.is_absolute() and saved.parent == tmp_path / "out" and saved.is_file()
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any(str(saved) in n for n in notices), notices  # in the transcript: it does not fade

    drive(app, body)


def test_the_first_start_says_it_measures_this_machine(model_path: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibration yet (a fresh data folder): the chat says what the first start is doing, and for how long,
    instead of a silent "Loading the model…"."""
    import dataclasses

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    adaptive = options(model_path, k=None)
    few = dataclasses.replace(adaptive, speculation=dataclasses.replace(adaptive.speculation, k_max=2))
    app = ChatApp(few)

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any(n.startswith("Measuring this machine's pass costs, once: ~") for n in notices), notices

    drive(app, body)


def test_slash_predict_drafts_the_next_answer_from_the_last_one(model_path: Path) -> None:
    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        await pilot.press(*"/predict", "enter")  # nothing to predict from yet: said, nothing set
        assert app.predict_next is None
        first = await ask(pilot, REPEAT_PROMPT)
        last = app.conversation.turns[-1].text
        await pilot.press(*"/predict", "enter")
        await until(pilot, lambda: app.predict_next == last, timeout=10)
        finished = await ask(pilot, "Write it once more.")
        stats = finished.stats
        # the prediction was the last answer: OpenAI's count of it, and drafts taken from it
        assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens >= first.stats.generated_tokens - 1
        assert stats.prediction_drafted > 0
        assert app.predict_next is None  # one answer only

    drive(app, body)
