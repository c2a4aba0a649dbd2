"""What a runtime learns of its device, once, when it opens a model: where the model's passes run.

The calibration caches are keyed by these facts, the pass-shape timing asks whether CUDA graphs run, and the reports
say where the passes ran; all of them take this one value instead of asking llama.cpp and the settings again.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.backend import describe_device, gpu_backend_name
from localspec.engine.model import Model
from localspec.machine import processor_name


@dataclass(frozen=True, slots=True)
class Device:
    """Where one loaded model's passes run, with ``threads`` CPU threads."""

    threads: int
    gpu_layers: int  # of the model's n_layer + 1 offloadable layers, as llama.cpp places them (0: none can be)
    graphs: bool  # its passes run as CUDA graphs, which replay only a steady pass shape (speculative/shapes.py)
    remote: str  # the RPC servers that hold the offloaded layers ("": this machine's own devices)
    name: str  # what runs the passes, in the calibration cache's names: "CUDA GPU, <processor>", "<processor>"
    description: str  # for people, in stats and reports: "CPU (2 threads)", "GPU: all 18 layers offloaded (CUDA)"

    @classmethod
    def of(cls, model: Model, threads: int) -> Device:
        return cls(threads, model.gpu_layers, model.graphs, model.remote, device_name(model.gpu_layers, model.remote),
                   describe_device(model.gpu_layers, model.n_layer, threads, model.remote))


def device_name(gpu_layers: int, remote: str = "") -> str:
    """What runs the passes, for the cache's name and the reports: the GPU backend or the RPC servers, and/or the
    processor (an RPC setup and a local one never share figures: the round trips are in every pass)."""
    cpu = processor_name()
    if remote and gpu_layers > 0:
        return f"RPC {remote}, {cpu}"
    return f"{gpu_backend_name()} GPU, {cpu}" if gpu_layers > 0 else cpu
