"""A seed reproduces its text on the real model, with the history on disk: the same seeded command three times gives
one text, though each run writes its answer into the history the next one could draft from, and though live timings
differ from run to run (a pass's size moves llama.cpp's logits: docs/speculation.md, "What a seed promises")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import localspec
from localspec.cli import app

# a passage to copy: n-gram lookup drafts long here, so pass sizes vary with whatever steers them
PROMPT = ("Here is a passage:\n\nThe lighthouse on Pell Island was built in 1871 from granite quarried on the "
          "mainland. Its lamp, first fuelled by whale oil and later by kerosene, was replaced by an electric beacon in "
          "1934.\n\nCopy the passage above exactly, word for word:\n\n")
N = 40  # seed 1 copies the passage here: the lookup drafts, and its drafts steer the pass sizes


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A LOCALSPEC_HOME of the test's own, with the history on disk (run's default), and the pass costs measured
    already copied in (not measured again)."""
    calibration = Path(os.environ["LOCALSPEC_HOME"]) / "cache" / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, tmp_path / "cache" / "calibration")
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("LOCALSPEC_HISTORY", raising=False)
    return tmp_path


def _requests_kept(home: Path) -> int:
    shown = CliRunner().invoke(app, ["cache", "--json"])
    assert shown.exit_code == 0, shown.output
    return sum(s["requests"] for h in json.loads(shown.stdout)["histories"] for s in h["scopes"].values())


def test_the_same_seeded_command_three_times_gives_one_text_with_the_history_on(model_path: Path,
                                                                                own_home: Path) -> None:
    runner = CliRunner()
    texts, drafted = [], []
    for _ in range(3):
        result = runner.invoke(app, ["run", PROMPT, "-m", str(model_path), "--drafter", "ngram", "--temperature",
                                     "0.8", "--seed", "1", "-n", str(N), "--ctx", "512", "--json"])
        assert result.exit_code == 0, result.stderr
        out = json.loads(result.stdout)
        texts.append(out["text"])
        drafted.append(out["stats"]["drafted"])
        assert out["stats"]["cache_drafted"] == 0  # the run before wrote its answer: a seeded run drafts from its own
    assert texts[0] == texts[1] == texts[2], texts
    assert min(drafted) > 0  # it speculated: pass sizes were chosen, not all 1
    assert _requests_kept(own_home) == 3  # and the history was on, on disk, across the three
    # the seed is used: --seed 2 samples another text (were seed or temperature dropped, the two would agree)
    other = runner.invoke(app, ["run", PROMPT, "-m", str(model_path), "--drafter", "ngram", "--temperature", "0.8",
                                "--seed", "2", "-n", str(N), "--ctx", "512", "--json"])
    assert other.exit_code == 0 and json.loads(other.stdout)["text"] != texts[0], other.stdout


def test_the_python_api_with_a_seed_gives_one_text_with_the_history_on(model_path: Path, own_home: Path) -> None:
    """generate() runs through the batch scheduler (one lane): the same promise there."""
    results = [localspec.generate(PROMPT, model=str(model_path), drafter="ngram", temperature=0.8, seed=1,
                                  max_tokens=N, ctx=512) for _ in range(3)]
    assert all(r.error is None for r in results), [r.error for r in results]
    assert results[0].text == results[1].text == results[2].text, [r.text for r in results]
    assert all(r.stats.cache_drafted == 0 for r in results) and results[0].stats.drafted > 0
    assert _requests_kept(own_home) == 3
    other = localspec.generate(PROMPT, model=str(model_path), drafter="ngram", temperature=0.8, seed=2, max_tokens=N,
                               ctx=512)
    assert other.error is None and other.text != results[0].text, other.text  # the seed is used


def test_a_job_whose_every_line_has_a_seed_repeats_its_texts_busy_first_then_quiet(model_path: Path,
                                                                                   tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                                   ) -> None:
    """Reproduced at 0f55e20: in a fresh home, 4 lines each with its own seed 7 at temperature 0.8, parallel 4,
    first beside two busy processes, then on a quiet machine: 2 of 4 texts changed, since the second run measured
    the disturbed pass costs again. A seed on every line is a seeded job: the provisional calibration is kept."""
    from tests.test_calibration import busy_cores

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))  # fresh: nothing measured yet
    monkeypatch.setenv("LOCALSPEC_HISTORY", "off")
    lines = [{"id": str(i), "prompt": f"{PROMPT}({i})", "seed": 7, "temperature": 0.8, "max_tokens": 24}
             for i in range(4)]

    def texts() -> list[str]:
        results = list(localspec.generate_many(lines, model=str(model_path), drafter="ngram", parallel=4, ctx=1024))
        assert all(r.error is None for r in results), [r.error for r in results]
        return [r.text for r in results]

    with busy_cores():
        busy = texts()
    assert texts() == busy
