"""Layer-skip drafts on the real models through the real llama.cpp: the subset file (built once, cached, never
half-written, its block count and per-layer arrays right), Gemma 3's sliding-window layers where the original blocks
had them (read from llama.cpp's own log of the cache it builds), and greedy output equal to target-only's."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import llama_cpp
import pytest

from localspec.drafters import block_subset
from localspec.drafters.block_subset import Subset, swa_layers
from localspec.drafters.early_exit import early_exit_model
from localspec.drafters.layer_skip import layer_skip_model
from localspec.engine import Context, Model
from localspec.engine.backend import init_backend
from localspec.engine.rewrite import copy_model
from localspec.events import Step
from localspec.gguf import edit as gguf_edit
from localspec.gguf.header import read_header
from localspec.runtime import Runtime
from localspec.settings import GenerationSettings, RuntimeSettings, SamplingSettings, Settings, SpeculationSettings
from tests.conftest import assert_one_line_error, localspec
from tests.lossless import assert_lossless, margin

# block 4 skipped: Gemma's global blocks 5, 11 and 17 become 4, 10 and 16, which llama.cpp's rule (every 6th,
# counted from 0) would make local, and its 11 → 10 would move the 11th too
SKIP = "4"
GLOBAL_AFTER = [4, 10, 16]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def subset_file(model_path: Path, home: Path) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_HOME", str(home))  # the cache of this module's own: built here, not found
        return layer_skip_model(model_path, Subset.parse(SKIP, 18))


def sliding_window_blocks(path: Path) -> list[bool]:
    """Which blocks llama.cpp runs with sliding-window attention, as it decides: the blocks its non-SWA cache leaves
    out ("layer N: filtered", logged while it builds the caches of a context)."""
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", "replace"))

    with Model(path) as model:
        llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
        try:
            with Context(model, n_ctx=64, n_batch=64):
                n = model.n_layer
        finally:
            init_backend()  # localspec's own log routing back
    log = "".join(lines)
    assert "creating non-SWA KV cache" in log, "no sliding-window cache: this is not a Gemma 3 model"
    dense = log.split("creating non-SWA KV cache")[1].split("creating     SWA KV cache")[0]
    filtered = {int(i) for i in re.findall(r"layer\s+(\d+): filtered", dense)}
    return [i in filtered for i in range(n)]


def test_the_subset_file_has_the_kept_blocks_and_is_cached(model_path: Path, subset_file: Path, home: Path) -> None:
    header, source = read_header(subset_file), read_header(model_path)
    assert subset_file.parent == home / "cache" / "layer-skip" and subset_file.name.endswith("-skip4.gguf")
    assert header.block_count == 17
    assert {t.name.split(".")[1] for t in header.tensors if t.name.startswith("blk.")} == {str(i) for i in range(17)}
    # the per-layer array it carries: one entry per kept block, each the original block's
    pattern = gguf_edit.read_array(subset_file, "gemma3.attention.sliding_window_pattern")
    assert pattern is not None and len(pattern[1]) == 17
    original = swa_layers(source)
    assert original is not None and pattern[1] == [original[i] for i in range(18) if i != 4]
    assert [p.name for p in subset_file.parent.iterdir()] == [subset_file.name]  # no temporary file left
    mtime = subset_file.stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_HOME", str(home))
        assert layer_skip_model(model_path, Subset.parse(SKIP, 18)) == subset_file
    assert subset_file.stat().st_mtime_ns == mtime  # found, not built again


def test_a_subset_that_fails_its_check_leaves_no_file(model_path: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))

    def refuse(*args: object) -> None:
        raise RuntimeError("checked: wrong")

    monkeypatch.setattr(block_subset, "check_subset", refuse)
    with pytest.raises(RuntimeError, match="checked: wrong"):
        layer_skip_model(model_path, Subset.parse("6-11", 18))
    assert list((tmp_path / "cache" / "layer-skip").iterdir()) == []  # nothing under the final name, no temp file
    with pytest.raises(RuntimeError, match="checked: wrong"):  # early exit's subset is built and checked the same way
        early_exit_model(model_path, 6, 18)
    assert list((tmp_path / "cache" / "early-exit").iterdir()) == []


def test_gemma_keeps_its_sliding_window_blocks_where_the_original_had_them(
    model_path: Path, subset_file: Path, tmp_path: Path,
) -> None:
    original = sliding_window_blocks(model_path)
    assert [i for i, swa in enumerate(original) if not swa] == [5, 11, 17]  # llama.cpp's rule on the original
    kept = [original[i] for i in range(18) if i != 4]
    assert sliding_window_blocks(subset_file) == kept
    assert [i for i, swa in enumerate(kept) if not swa] == GLOBAL_AFTER
    # without the pattern written out, the renumbered blocks follow the rule: the trap this guards against
    bare = tmp_path / "pruned.gguf"
    copy_model(model_path, bare, prune_layers=[4])
    assert [i for i, swa in enumerate(sliding_window_blocks(bare)) if not swa] == [5, 11]


def test_greedy_with_the_layer_skip_drafter_is_lossless(model_path: Path, home: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))  # the subset the module built
    spec = SpeculationSettings(drafter="layer-skip", skip_layers=SKIP, k=3)
    prompts = ["Here is a list: apples, pears, plums, cherries, grapes.\nRepeat the list exactly:\n",
               "The capital of France is"]
    with Runtime.open(Settings(str(model_path), RuntimeSettings(n_ctx=1024), spec, SamplingSettings())) as rt:
        accepted = 0
        for prompt in prompts:
            rt.generator.policy.reset()
            rt.generator.policy.fixed = 3
            steps = [e for e in rt.generator.generate(rt.prompt_tokens(prompt), GenerationSettings(max_tokens=24))
                     if isinstance(e, Step)]
            assert_lossless(rt.model, rt.prompt_tokens(prompt), [t.id for s in steps for t in s.emitted],
                            margin(rt.model), label=prompt[:20])
            accepted += sum(len(s.accepted) for s in steps)
        assert accepted > 0  # the drafts were used, not all refused


def test_qwen_has_no_layer_property_tied_to_its_block_index() -> None:
    from tests.test_qwen_pair import _pair

    pair = _pair()
    if pair is None:
        pytest.skip("the Qwen2.5-Coder pair is not in localspec's home: `localspec pull qwen2.5-coder-1.5b`")
    header = read_header(pair[0])
    assert header.architecture == "qwen2" and header.block_count == 28
    assert swa_layers(header) is None  # no sliding window: nothing moves when blocks are renumbered
    assert block_subset.subset_arrays(pair[0], header, Subset.parse("7-20", 28)) == {}


@pytest.mark.parametrize("args,fragment", [
    (["--drafter", "layer-skip", "--skip-layers", "8-x"], "ranges like 8-19"),
    (["--drafter", "layer-skip", "--skip-layers", "9-4"], "runs backwards"),
    (["--skip-layers", "3-5"], "is for --drafter layer-skip"),
    (["--drafter", "layer-skip", "--skip-layers", "0-5"], "between 1 and 16"),
])
def test_bad_skip_layers_is_one_line(args: list[str], fragment: str) -> None:
    result = localspec(["run", "hi", "--max-tokens", "1", *args])
    assert_one_line_error(result.code, result.stderr, fragment)


def test_help_teaches_it() -> None:
    result = localspec(["run", "--help"])
    text = " ".join(result.stdout.split())
    assert "layer-skip" in text and "--skip-layers" in text
