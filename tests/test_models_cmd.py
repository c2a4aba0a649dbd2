"""`localspec models` and the GGUF header reader it relies on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.cli import app
from localspec.errors import ModelLoadError
from localspec.gguf.header import check_complete, is_gguf, read_header
from localspec.models import hub
from tests.conftest import assert_one_line_error
from tests.hub_server import HubServer, make_gguf


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in ("HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


# ---- GGUF header ----------------------------------------------------------------------------------------------


def test_header_fields(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(make_gguf(arch="qwen2", layers=3, context_length=4096, file_type=7, chat_template="{{x}}"))
    h = check_complete(path)
    assert (h.architecture, h.block_count, h.context_length, h.file_type) == ("qwen2", 3, 4096, "Q8_0")
    assert h.has_chat_template and h.vocab_size == 4 and h.tensor_count == 3
    assert h.data_end() == path.stat().st_size
    assert is_gguf(path)


def test_not_gguf_truncated_and_empty(tmp_path: Path) -> None:
    data = make_gguf(layers=2)
    bad = tmp_path / "notes.gguf"
    bad.write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ModelLoadError, match="not a GGUF model file .*Git LFS pointer"):
        read_header(bad)
    assert not is_gguf(bad)

    header_cut = tmp_path / "cut1.gguf"
    header_cut.write_bytes(data[:40])
    with pytest.raises(ModelLoadError, match="cut1.gguf is truncated: the GGUF header ends early"):
        read_header(header_cut)

    data_cut = tmp_path / "cut2.gguf"
    data_cut.write_bytes(data[:-10])
    read_header(data_cut)  # the header itself is whole
    with pytest.raises(ModelLoadError, match=r"cut2.gguf is truncated: .* bytes but its tensors need"):
        check_complete(data_cut)

    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is empty"):
        read_header(empty)
    with pytest.raises(ModelLoadError, match="model file not found"):
        read_header(tmp_path / "absent.gguf")


def test_embedded_model_header_is_complete() -> None:
    """The real embedded GGUF: every tensor type size in our table adds up to the exact file length."""
    from localspec.paths import models_dir

    candidates = list(models_dir().glob("gemma-3-270m-q4_k_m.gguf")) if models_dir().exists() else []
    if not candidates:
        pytest.skip("embedded model not assembled in this environment")
    h = check_complete(candidates[0])
    assert (h.architecture, h.block_count, h.file_type) == ("gemma3", 18, "Q4_K_M")
    assert h.data_end() == h.file_size


# ---- the command ------------------------------------------------------------------------------------------------


def test_models_lists_registry_downloads_and_profiles(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = env / "home" / "config"
    config.mkdir(parents=True)
    (config / "models.toml").write_text(
        '[models.tiny]\nrepo = "acme/Tiny-GGUF"\nfile = "Tiny-Q4_K_M.gguf"\n'
        '[models.later]\nrepo = "acme/Later-GGUF"\nfile = "Later-Q8_0.gguf"\n'
    )
    with HubServer() as server:
        server.add("acme/Tiny-GGUF", {"Tiny-Q4_K_M.gguf": make_gguf(arch="llama", layers=5, context_length=2048)})
        server.add("acme/Other-GGUF", {"Other-Q8_0.gguf": make_gguf(arch="qwen2", layers=2, file_type=7, seed=3)})
        for repo, file in (("acme/Tiny-GGUF", "Tiny-Q4_K_M.gguf"), ("acme/Other-GGUF", "Other-Q8_0.gguf")):
            hub.pull_file(repo, file, endpoint=server.url, token=False, progress=False)

    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {m["name"]: m for m in out["models"]}
    tiny = rows["tiny"]
    assert tiny["status"] == "downloaded"
    assert (tiny["architecture"], tiny["layers"], tiny["context_length"], tiny["quant"]) == ("llama", 5, 2048, "Q4_K_M")
    assert Path(tiny["path"]).is_file() and str(env / "hf" / "hub") in tiny["path"]
    assert rows["later"]["status"] == "not downloaded" and rows["later"]["path"] is None
    other = rows["acme/Other-GGUF/Other-Q8_0.gguf"]  # pulled by repo id, not in the registry: listed too
    assert (other["architecture"], other["quant"]) == ("qwen2", "Q8_0")
    assert rows["gemma3-270m"]["status"] == "embedded"
    assert {p["name"] for p in out["profiles"]} >= {"qwen2.5-7b", "llama3.1-8b", "gemma3-12b"}

    text = CliRunner().invoke(app, ["models", "--paths"])
    assert text.exit_code == 0
    assert "PROFILES" in text.stdout and "tiny" in text.stdout and "not downloaded" in text.stdout
    assert str(env / "home" / "config" / "models.toml") in text.stdout


def test_models_reports_a_broken_user_file_in_one_line(env: Path) -> None:
    config = env / "home" / "config"
    config.mkdir(parents=True)
    (config / "models.toml").write_text("[models.x]\nrepo = 'a/b'\nfile = \n")
    result = CliRunner().invoke(app, ["models"])
    assert_one_line_error(result.exit_code, result.stderr, f"{config / 'models.toml'}:3: invalid TOML")


def test_loading_a_good_model_never_parses_its_header(model_path: Path) -> None:
    # the header walk over a 262k-token vocabulary took 0.1-0.7 s of every start; it is kept for refused files
    import subprocess
    import sys

    probe = ("import localspec.gguf.header as g\n"
             "def refuse(*a, **k): raise SystemExit('parsed the header')\n"
             "g.read_header = g.check_complete = refuse\n"
             "from localspec.engine import Model\n"
             f"Model({str(model_path)!r}).close()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
