"""GPU offload is the default where the build has it; elsewhere an explicit --gpu-layers says it runs on the CPU.

These run on whatever llama-cpp-python is installed; the CPU-build cases skip on a GPU build and vice versa.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from localspec.cli.options import build_options
from localspec.engine import Context, Device, Model
from localspec.engine.backend import describe_device, gpu_offload_supported
from localspec.opening import NO_GPU_OFFLOAD
from localspec.paths import cache_dir
from localspec.runtime import Runtime
from localspec.settings import RuntimeSettings, Settings, SpeculationSettings
from localspec.speculative.calibrate import load_or_measure
from tests.conftest import localspec

GPU_BUILD = gpu_offload_supported()  # not llama_supports_gpu_offload: an RPC build says yes with no GPU
cpu_build_only = pytest.mark.skipif(GPU_BUILD, reason="this llama-cpp-python offloads to a GPU")
gpu_build_only = pytest.mark.skipif(not GPU_BUILD, reason="this llama-cpp-python has no GPU offload")



def test_gpu_layers_default_to_all_where_the_build_offloads_and_to_zero_elsewhere():
    expected = -1 if GPU_BUILD else 0
    assert RuntimeSettings().n_gpu_layers == expected
    assert build_options(gpu_layers=None).runtime.n_gpu_layers == expected
    assert build_options(gpu_layers=3).runtime.n_gpu_layers == 3
    assert RuntimeSettings(n_gpu_layers=0).n_gpu_layers == 0


def test_device_descriptions():
    assert describe_device(0, 18, 2) == "CPU (2 threads)"
    assert describe_device(19, 18, 2).startswith("GPU: all 18 layers offloaded (")
    partial = describe_device(7, 18, 4)
    assert partial.startswith("GPU: 7 of 19 layers offloaded (") and partial.endswith("the rest on the CPU (4 threads)")


@cpu_build_only
def test_an_explicit_gpu_layers_on_a_cpu_build_says_so_once_and_runs_on_the_cpu(model_path):
    result = localspec(["run", "hi", "--max-tokens", "1", "--drafter", "none", "--gpu-layers", "-1", "--threads", "1"])
    assert result.code == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if "GPU" in line]
    assert notices == [f"localspec: {NO_GPU_OFFLOAD}"], result.stderr
    assert "stop: " in result.stderr and "· CPU (1 thread)" in result.stderr


@cpu_build_only
def test_the_default_on_a_cpu_build_says_nothing_about_the_gpu_and_reports_the_cpu(model_path):
    result = localspec(["run", "hi", "--max-tokens", "1", "--drafter", "none", "--threads", "1", "--json"])
    assert result.code == 0, result.stderr
    assert "GPU" not in result.stderr
    assert json.loads(result.stdout)["stats"]["device"] == "CPU (1 thread)"


@gpu_build_only
def test_the_default_on_a_gpu_build_offloads_every_layer(model_path):
    result = localspec(["run", "hi", "--max-tokens", "1", "--drafter", "none", "--json"])
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["stats"]["device"].startswith("GPU: all ")


def test_runtime_reports_its_device(model_path):
    runtime = RuntimeSettings(n_ctx=256, n_threads=1)
    with Runtime.open(Settings(str(model_path), runtime, SpeculationSettings(drafter="none"))) as rt:
        if GPU_BUILD:
            assert rt.device.description.startswith(f"GPU: all {rt.model.n_layer} layers offloaded (")
        else:
            assert rt.device.description == "CPU (1 thread)"
            assert rt.notices == []


@cpu_build_only
def test_calibration_is_not_keyed_by_gpu_layers_on_a_cpu_build(model_path, capsys):
    fake_hash = uuid.uuid4().hex  # a key no earlier run can have cached
    try:
        with Model(model_path) as model, Context(model, n_ctx=128, n_threads=1) as ctx:
            first = load_or_measure(ctx, fake_hash, Device.of(model, 2), 2).seconds
            assert "measuring" in capsys.readouterr().err
            for gpu_layers in (-1, 5):
                with Model(model_path, n_gpu_layers=gpu_layers) as asked:
                    device = Device.of(asked, 2)
                assert device == Device.of(model, 2)  # a CPU build offloads no layer, whatever was asked
                # retry=False: a first measurement the machine disturbed is still the cache to find here
                assert load_or_measure(ctx, fake_hash, device, 2, retry=False).seconds == first
                assert "measuring" not in capsys.readouterr().err
    finally:
        for path in Path(cache_dir(), "calibration").glob(f"{fake_hash[:16]}-*"):
            path.unlink()
