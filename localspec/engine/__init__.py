"""The engine layer: the only code in localspec that touches llama_cpp (ctypes).

Everything above it speaks token ids, numpy arrays and dataclasses.
"""

from localspec.engine.backend import init_backend, library_version, system_info
from localspec.engine.chat import ChatTemplate, Message
from localspec.engine.context import Context
from localspec.engine.device import Device
from localspec.engine.model import Model
from localspec.engine.vocab import Vocab

__all__ = [
    "ChatTemplate",
    "Context",
    "Device",
    "Message",
    "Model",
    "Vocab",
    "init_backend",
    "library_version",
    "system_info",
]
