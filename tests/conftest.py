"""Shared fixtures. Tests never touch ~: localspec's home is a git-ignored folder in the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

# first: loads llama.cpp's libraries before any test module imports numpy (README 'GPU')
import localspec as _localspec  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("LOCALSPEC_HOME", str(ROOT / ".localspec-home"))
# run in parallel (pytest-xdist, scripts/test), each worker keeps to a core of its own, and so do the processes it
# starts: llama.cpp then runs one thread a worker (machine.usable_cores) instead of every worker's threads on every
# core, which runs some passes ~100x slower
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= len(_cores):
        os.sched_setaffinity(0, {_cores[int(_worker[2:]) % len(_cores)]})
# no history by default, whatever the shell set: a lossless test that first runs target-only would otherwise draft
# that very answer from it, and no test may read or write one on disk by accident. The history's own tests opt in
# (the ``history_on`` fixture, or settings and flags of their own) and keep files under a LOCALSPEC_HOME of their own
os.environ["LOCALSPEC_HISTORY"] = "off"


# the longest files first (worker-seconds each, --durations=0 on 2026-11-29: 128 down to 50): pytest-xdist hands a
# worker the next file as it ends one, so a long file taken last ran on while the other worker had nothing left
_LONGEST_FIRST = ("test_serve", "test_structured", "test_rpc", "test_batch_draft", "test_tui", "test_speculative_real",
                  "test_isolation", "test_run_cli", "test_hostile")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).stem, len(rank)))  # stable: the rest as collected


@pytest.fixture
def history_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The history as a user has it: each face's own default (on disk where the test's home is its own)."""
    monkeypatch.delenv("LOCALSPEC_HISTORY")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded default model (Gemma 3 270M Q4_K_M), assembled once per checkout."""
    from localspec.models.embedded import ensure_default_model

    return ensure_default_model(progress=False)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def localspec(args: Sequence[str], *, input: str | None = None, timeout: float = 120,
              env: dict[str, str] | None = None) -> Result:
    """Run the real `localspec` command in a subprocess, as a user would (``env``: variables set for it)."""
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", **(env or {})},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def interruptible() -> None:
    """preexec_fn for a child that a test will Ctrl-C: a shell that started the tests in the background may have
    passed SIGINT down as ignored, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def assert_one_line_error(code: int, stderr: str, *fragments: str) -> None:
    """What every bad input must give: exit code 2 and one `localspec: error:` line naming the problem."""
    assert code == 2, (code, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("localspec: error:"), lines[0]
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
