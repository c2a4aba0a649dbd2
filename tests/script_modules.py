"""The project's scripts/ and tools/ (not packages) imported as modules, for tests of their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "scripts", ROOT / "tools")  # what a user runs; the maintainers' measurement tools


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py or tools/NAME.py as the module NAME."""
    path = next((folder / f"{name}.py" for folder in FOLDERS if (folder / f"{name}.py").is_file()), None)
    assert path is not None, f"no {name}.py in scripts/ or tools/"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module
