"""Bad input is refused before any expensive work, in every face: in a fresh home (nothing measured yet, no cache),
the error comes first and alone, and nothing was measured for it (no calibration written).

Each case runs in a home of its own whose only content is the embedded model: a warm home would hide a measurement
the bad input waited for (a test that passed only after another had cached the calibration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import localspec
from localspec.engine.rewrite import copy_model
from tests.conftest import assert_one_line_error
from tests.conftest import localspec as cli

LONG = "word " * 600  # 602 tokens: past --ctx 256


@pytest.fixture
def fresh_home(tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home that holds the embedded model and nothing else (the model is linked, not copied)."""
    home = tmp_path / "home"
    models = home / "data" / "models"
    models.parent.mkdir(parents=True)
    models.symlink_to(model_path.parent, target_is_directory=True)
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    return home


def measured(home: Path) -> bool:
    return (home / "cache" / "calibration").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["run", LONG, "--ctx", "256"], "the prompt is 602 tokens but the context holds 256"),
    (["run", "hi", "--chat", "--system", LONG, "--ctx", "256"], "but the context holds 256"),
    (["run", "hi", "--drafter", "draft", "--draft", "{notes}"], "is not a GGUF model file"),
    (["run", "hi", "--drafter", "draft", "--draft", "{other}"], "does not share"),
    (["run", "hi", "--prediction", "{big}"], "the prediction is"),
    (["run", "hi", "--drafter", "early-exit", "--exit-layer", "99"], "--exit-layer must be between 1 and 17"),
    (["bench", "--suite", "{suite}", "--ctx", "256"], "row 'long': the prompt is 602 tokens"),
    (["serve", "--drafter", "draft", "--draft", "{notes}"], "is not a GGUF model file"),
    (["chat", "--resume", "999"], "no saved conversation 999"),
])
def test_a_face_s_bad_input_is_its_first_and_only_line(fresh_home: Path, tmp_path: Path, model_path: Path,
                                                        args: list[str], fragment: str) -> None:
    (tmp_path / "notes.gguf").write_text("not a model")
    (tmp_path / "big.py").write_text("word " * 9000)
    (tmp_path / "suite.jsonl").write_text(json.dumps({"id": "ok", "category": "c", "prompt": "hi"}) + "\n"
                                          + json.dumps({"id": "long", "category": "c", "prompt": LONG}) + "\n")
    files = {"notes": tmp_path / "notes.gguf", "big": tmp_path / "big.py", "suite": tmp_path / "suite.jsonl",
             "other": tmp_path / "other.gguf"}
    if "{other}" in args:  # the embedded model with another end-of-generation token: another tokenizer
        copy_model(str(model_path), str(files["other"]), int_overrides={"tokenizer.ggml.eos_token_id": 7})
    result = cli([a.format(**files) for a in args], env={"LOCALSPEC_HOME": str(fresh_home)})
    assert_one_line_error(result.code, result.stderr, fragment)
    assert not measured(fresh_home)


def test_a_batch_whose_every_line_is_refused_measures_nothing(fresh_home: Path, tmp_path: Path) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "a", "prompt": LONG}) + "\n"
                     + json.dumps({"id": "b", "messages": [{"role": "user", "content": LONG}]}) + "\n")
    result = cli(["batch", str(lines), "-o", "-", "--ctx", "256"], env={"LOCALSPEC_HOME": str(fresh_home)})
    assert result.code == 1, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a", "b"] and all("context holds 256" in r["error"] for r in records)
    assert result.stderr.splitlines() == ["localspec: 2 of 2 prompts failed: their error records are on stdout"]
    assert not measured(fresh_home)


def test_the_python_api_returns_a_prompt_too_long_before_measuring(fresh_home: Path, model_path: Path) -> None:
    result = localspec.generate(LONG, model=str(model_path), ctx=256)
    assert not result.ok and "the prompt is 602 tokens but the context holds 256" in (result.error or "")
    assert not measured(fresh_home)
