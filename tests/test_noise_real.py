"""The near-tie margins measured on the real model: how far logits move between passes of 1, 4, 8 and 16 rows and the
lossless check's prefill, cached per model and device like the pass costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.engine import Context, Model
from localspec.engine.device import Device
from localspec.models.files import known_sha256
from localspec.speculative.noise import HEADROOM, ROWS, load_or_measure_noise, measure_noise


def test_the_margins_are_measured_by_pass_size_and_cached(model_path: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a home of its own: its short measurement must not stand in for the device's in the suite's shared cache
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    with Model(model_path) as model, Context(model, n_ctx=512, greedy_rows=17) as ctx:
        prompt = model.vocab.tokenize("A list of fruit: apples, pears, plums,", add_special=True)
        noise = measure_noise(ctx, [prompt], generated=20, every=4)
        assert set(noise.against_prefill) == set(ROWS) and set(noise.against_one_row) == set(ROWS[1:])
        assert noise.positions == 4
        # a 1-row decode is not the prefill's kernels either, and no path moves a pair by whole logits on a CPU
        assert 0.0 < noise.margin < 3.0 and noise.decode_margin < 3.0
        assert noise.margin == HEADROOM * max(noise.against_prefill.values())
        assert noise.margins() == {"prefill": noise.margin, "decode": noise.decode_margin}
        assert "near-tie margin" in noise.describe()
        assert ctx.tokens == []  # the cache is left empty
        said: list[str] = []
        device, sha = Device.of(model, 2), known_sha256(model_path)
        first = load_or_measure_noise(ctx, sha, device, [prompt[:6]], again=True, say=said.append, generated=10,
                                      every=4)
        again = load_or_measure_noise(ctx, sha, device, [prompt[:6]], say=said.append)
        assert again == first and len(said) == 1  # measured once, then read back
