"""Working with conversations in the chat: saved as they happen (a real SQLite file), resumed, picked, deleted;
earlier questions on Up; an answer written again, a question edited and resent, an answer copied; a new
conversation only after a yes. Plus what the chat says at start about a base model, and narrow windows.

The real app and the real embedded model, driven through Pilot; answers are greedy and a few tokens long.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.pilot import Pilot  # noqa: E402

from localspec.tui.app import ChatApp  # noqa: E402
from localspec.tui.conversation import Turn  # noqa: E402
from localspec.tui.screens import ConfirmScreen, ConversationsScreen  # noqa: E402
from localspec.tui.store import ChatStore  # noqa: E402
from localspec.tui.widgets import AnswerView  # noqa: E402
from tests.conftest import localspec  # noqa: E402
from tests.test_tui import SIZE, ask, drive, options, screen_text, until  # noqa: E402
from tests.test_tui_input import start_long_answer  # noqa: E402


def texts(app: ChatApp) -> list[str]:
    return [t.text for t in app.conversation.turns]


def saved_texts(path: Path, conversation_id: int | None) -> list[str]:
    """What another connection reads from the file right now."""
    assert conversation_id is not None
    store = ChatStore(path)
    try:
        return [t.text for t in store.load(conversation_id).turns]
    finally:
        store.close()


def shown_questions(app: ChatApp) -> list[str]:
    return [str(w.render()) for w in app.query(".user")]


async def answer_again(pilot: Pilot[ChatApp]) -> None:
    app = pilot.app
    before = app.last_finished
    await pilot.press("ctrl+r")
    await until(pilot, lambda: app.last_finished is not before and not app.busy)


def test_a_conversation_is_saved_as_it_happens_and_resumed(model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    async def first() -> tuple[int, list[str]]:
        app = ChatApp(options(model_path, max_tokens=6), store=ChatStore(path), system="Answer briefly.")
        async with app.run_test(size=SIZE) as pilot:
            await ask(pilot, "Name a colour.")
            assert saved_texts(path, app.session.id) == texts(app)  # saved while the app runs
            await ask(pilot, "Name another one.")
            assert saved_texts(path, app.session.id) == texts(app)
            assert app.session.id is not None
            return app.session.id, texts(app)

    conversation_id, before = asyncio.run(first())

    async def resumed() -> None:
        app = ChatApp(options(model_path, max_tokens=6), store=ChatStore(path), resume=conversation_id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.ready)
            assert texts(app) == before and app.conversation.system == "Answer briefly."
            assert shown_questions(app) == ["Name a colour.", "Name another one."]
            assert len(app.query(AnswerView)) == 2

            # Up recalls the earlier questions, newest first; Down comes back to what was being typed
            box = app.prompt_input
            await pilot.press(*"draft", "up")
            assert box.text == "Name another one."
            await pilot.press("up", "up")
            assert box.text == "Name a colour."
            await pilot.press("down")
            assert box.text == "Name another one."
            await pilot.press("down")
            assert box.text == "draft"
            box.set_text("")

            # the next question continues the saved conversation
            await ask(pilot, "And a third?")
            assert saved_texts(path, conversation_id) == texts(app) and len(texts(app)) == 6

            # Ctrl+L asks, then starts a new conversation; the old one stays saved and Ctrl+O brings it back
            await pilot.press("ctrl+l")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            assert texts(app) == [] and not app.query(AnswerView) and app.session.id is None
            await pilot.press("ctrl+o")
            assert isinstance(app.screen, ConversationsScreen)
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
            assert app.session.id == conversation_id and len(texts(app)) == 6
            assert shown_questions(app)[-1] == "And a third?"

            # deleting it in the picker asks first: Esc (or n) keeps it
            await pilot.press("ctrl+o", "d")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("escape")
            assert isinstance(app.screen, ConversationsScreen)
            assert app.session.store is not None and len(app.session.store.list()) == 1
            # y deletes it from the file, and the screen starts afresh
            await pilot.press("d", "y")
            assert isinstance(app.screen, ConversationsScreen)
            await pilot.press("escape")
            assert texts(app) == [] and app.session.id is None
            assert app.session.store.list() == []

    asyncio.run(resumed())


def test_answer_again_edit_and_resend_copy(model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"

    app = ChatApp(options(model_path, max_tokens=6), store=ChatStore(path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await ask(pilot, "Name a colour.")
        first = app.conversation.turns[-1]

        # F4 copies the last answer
        await pilot.press("f4")
        assert app.clipboard == first.text and first.text

        # Ctrl+R writes the last answer again: it replaces the old one, on screen and in the file
        await answer_again(pilot)
        assert len(app.conversation.turns) == 2 and app.conversation.turns[-1] is not first
        assert len(app.query(AnswerView)) == 1
        assert saved_texts(path, app.session.id) == texts(app)

        # F3 takes the last question back into the input; Enter sends the edited one
        await pilot.press("f3")
        assert app.prompt_input.text == "Name a colour." and texts(app) == []
        assert not app.query(AnswerView) and shown_questions(app) == []
        assert saved_texts(path, app.session.id) == []
        await pilot.press("backspace", *" please.")
        await pilot.press("enter")
        await until(pilot, lambda: len(texts(app)) == 2 and not app.busy)
        assert texts(app)[0] == "Name a colour please."
        assert shown_questions(app) == ["Name a colour please."]
        assert saved_texts(path, app.session.id) == texts(app)

    drive(app, body)


def test_a_base_model_says_so_once_and_names_an_instruction_tuned_one(model_path: Path) -> None:
    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        notices = [str(n.render()) for n in app.query(".notice")]
        advice = [n for n in notices if "base model" in n]
        assert len(advice) == 1, notices
        assert "localspec pull gemma3-270m-it" in advice[0]

    drive(app, body)
    # the model it names is in the registry: `localspec models` lists it, without errors
    listed = localspec(["models"])
    assert listed.code == 0 and "error" not in listed.stderr.lower(), listed.stderr
    assert "gemma3-270m-it" in listed.stdout


def test_a_narrow_window_folds_the_stats_panel_away(model_path: Path) -> None:
    app = ChatApp(options(model_path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        assert not app.query_one("#side").display
        assert app.transcript.size.width >= 66  # the whole window, less its padding
        await pilot.resize_terminal(110, 30)
        await pilot.pause()
        assert app.query_one("#side").display
        assert app.transcript.size.width < 80

    drive(app, body, size=(70, 30))


def saved_turns(path: Path) -> list[Turn]:
    """Every turn of the latest saved conversation, as another connection reads the file right now."""
    store = ChatStore(path)
    try:
        latest = store.latest()
        return store.load(latest).turns if latest is not None else []
    finally:
        store.close()


def test_an_answer_is_saved_as_it_streams(model_path: Path, tmp_path: Path) -> None:
    """A crash mid-answer (kill -9) keeps what was on screen: the file already holds it, marked interrupted."""
    path = tmp_path / "chats.sqlite3"
    app = ChatApp(options(model_path, drafter="none", k=None, max_tokens=2000), store=ChatStore(path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await start_long_answer(pilot, app)
        view = app.query(AnswerView).last()
        await until(pilot, lambda: len(app.answer_steps) >= 6 and bool(view.text))
        # between two awaits the UI cannot repaint: what the screen shows now is what the file must hold
        assert app.busy
        on_screen = view.text
        question, answer = saved_turns(path)
        assert (question.role, answer.role) == ("user", "assistant")
        assert answer.text == on_screen and answer.stop_reason == "interrupted" and answer.stats is None
        await until(pilot, lambda: len(view.text) > len(on_screen) + 5)
        assert saved_turns(path)[-1].text == view.text  # and it keeps up
        # the end replaces it: the final text, stats and stop reason, in the same row
        await pilot.press("escape")
        await until(pilot, lambda: not app.busy)
        turns = saved_turns(path)
        assert len(turns) == 2 and turns[1].saved_id == answer.saved_id
        assert turns[1].text == view.text and turns[1].stats is not None
        assert turns[1].stats.generated_tokens == app.last_finished.stats.generated_tokens  # type: ignore[union-attr]

    drive(app, body)


def test_quitting_mid_answer_keeps_it_and_answer_again_replaces_it(model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    app = ChatApp(options(model_path, drafter="none", k=None, max_tokens=2000), store=ChatStore(path))
    shown: list[str] = []

    async def quit_mid_answer(pilot: Pilot[ChatApp]) -> None:
        await start_long_answer(pilot, app)
        view = app.query(AnswerView).last()
        await until(pilot, lambda: bool(view.text))
        shown.append(view.text)
        await pilot.press("ctrl+q")

    drive(app, quit_mid_answer)
    question, answer = saved_turns(path)
    assert answer.text.startswith(shown[0]) and answer.stop_reason == "interrupted" and answer.stats is None

    # resumed, it is shown with a mark that it was interrupted; Ctrl+R writes it again in its place
    store = ChatStore(path)
    again = ChatApp(options(model_path, max_tokens=4), store=store, resume=store.latest())

    async def resume(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: again.ready)
        (view,) = again.query(AnswerView)
        assert view.text == answer.text
        assert "interrupted" in screen_text(again, view)
        await answer_again(pilot)
        (view,) = again.query(AnswerView)
        assert "interrupted" not in screen_text(again, view)
        saved = saved_turns(path)
        assert [t.text for t in saved] == texts(again) and len(saved) == 2
        assert saved[1].stop_reason != "interrupted" and saved[1].stats is not None

    drive(again, resume)


def test_esc_before_the_first_token_takes_the_question_back(model_path: Path, tmp_path: Path) -> None:
    """Stopped before anything was written: no empty answer is kept; the question returns to the input, ahead of
    what was typed since, and the file holds no turn of it."""
    path = tmp_path / "chats.sqlite3"
    app = ChatApp(options(model_path, max_tokens=8), store=ChatStore(path))

    async def body(pilot: Pilot[ChatApp]) -> None:
        await until(pilot, lambda: app.ready)
        engine_free = threading.Event()
        app.engine.worker.submit(engine_free.wait, 60)  # the answer queues behind this on the engine thread
        try:
            await pilot.press(*"Name a colour.", "enter", *"more")
            assert app.busy and not app.answer_steps
            await pilot.press("escape")
        finally:
            engine_free.set()
        await until(pilot, lambda: not app.busy)
        await until(pilot, lambda: not app.query(AnswerView), timeout=10)  # Textual removes widgets on a later tick
        assert app.last_finished is not None and app.last_finished.stats.generated_tokens == 0
        assert app.conversation.turns == [] and not app.query(AnswerView) and shown_questions(app) == []
        assert app.prompt_input.text == "Name a colour.\nmore"
        assert saved_turns(path) == []
        assert any("back in the input" in str(n.render()) for n in app.query(".notice"))

    drive(app, body)
