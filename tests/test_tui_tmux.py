"""`localspec chat` in a real terminal (tmux), driven as a person would: type, Enter, read the screen, Ctrl+Q.

Pilot tests drive the app in-process; this one proves the installed command, the terminal driver and a clean
exit. Needs tmux (CI: ``apt-get install -y tmux``); skipped with a reason when it is absent.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from localspec.tui.store import ChatStore, default_path

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux)")




class Tmux:
    """One detached tmux session on a private server socket (never the user's own tmux)."""

    def __init__(self, tmp: Path) -> None:
        self.socket = str(tmp / "tmux.sock")
        self.session = f"localspec-{uuid.uuid4().hex[:8]}"

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        # COLUMNS/LINES (set under pytest) would override the pane's real size inside the app: drop them
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        done = subprocess.run(
            [TMUX, "-S", self.socket, *args], capture_output=True, text=True, timeout=20, env=env
        )
        return done.stdout

    def start(self, command: str, *, width: int = 120, height: int = 36) -> None:
        env = {"TERM": "xterm-256color"}
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
                  *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], command)  # fmt: skip

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", self.session, *(["-l"] if literal else []), *keys)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; the screen was:\n{screen}")

    def kill(self) -> None:
        self.tmux("kill-server")


def test_chat_in_a_real_terminal(model_path: Path, tmp_path: Path) -> None:
    rc_file = tmp_path / "rc"
    chat = [sys.executable, "-m", "localspec", "chat", "--model", str(model_path), "--temperature", "0",
            "--max-tokens", "24", "--drafter", "ngram", "--save-dir", str(tmp_path)]  # fmt: skip
    # Textual draws on stderr, so both streams stay on the terminal; the exit code is written when the app returns
    # and the shell lingers so the screen after exit can be read (a traceback would be there)
    command = f"{shlex.join(chat)}; echo $? > {shlex.quote(str(rc_file))}; sleep 60"
    term = Tmux(tmp_path)
    term.start(f"cd {shlex.quote(os.getcwd())} && {command}")
    try:
        term.wait_for(lambda s: "is ready" in s, 60, "the model to load")
        # Ctrl+J starts a second line of the message (a terminal sends it as a line feed); Enter sends both
        term.keys("Repeat: one two three,", literal=True)
        term.keys("C-j")
        # Enter and the next keys in one write, as fast typing arrives: the keys after Enter stay in the input
        term.keys("one two three.", "Enter", "after1")
        term.wait_for(lambda s: "Assistant" in s, 30, "the answer to start")
        screen = term.wait_for(lambda s: "tok/s" in s and "tokens ·" in s, 90, "the answer to finish")
        (tmp_path / "screen.txt").write_text(screen)
        assert "Repeat: one two three" in screen, screen  # the question in the transcript
        assert "after1" in screen.splitlines()[-3], screen  # in the input, above the footer
        assert "accept" in screen and "speedup" in screen, screen  # the stats panel
        term.keys("C-q")
        deadline = time.monotonic() + 20
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rc_file.exists(), f"the app did not exit on Ctrl+Q; the screen was:\n{term.screen()}"
        assert rc_file.read_text().strip() == "0"
        after = term.screen()
        assert "Traceback" not in after and "Error" not in after
        # the conversation was saved as it happened (the newest in the tests' home), both lines of the question
        store = ChatStore(default_path())
        try:
            saved = store.list()[0]
            turns = store.load(saved.id).turns
            store.delete(saved.id)
        finally:
            store.close()
        assert [t.role for t in turns] == ["user", "assistant"]
        assert turns[0].text == "Repeat: one two three,\none two three."
    finally:
        term.kill()
