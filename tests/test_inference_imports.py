"""Inference never reaches the downloader: it takes paths, hashes and names from localspec.models, nothing more.

Loading a model must not import huggingface_hub (slow, and the network code has no business there), and the
layout should say so: runtime.py, engine/, speculative/ and drafters/ import only models.files (paths, hashes),
models.registry (names) and gguf (reading and editing a header).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "localspec"
INFERENCE = sorted(
    [PACKAGE / "runtime.py", *(p for d in ("engine", "speculative", "drafters") for p in (PACKAGE / d).rglob("*.py"))]
)
# gguf.edit: writing a GGUF's header (layer-skip drafts), on disk only
ALLOWED = {"localspec.models.files", "localspec.models.registry", "localspec.gguf.header",
           "localspec.gguf.edit"}


def _imported(tree: ast.AST) -> set[str]:
    """The modules a file imports, at the top or inside a function; ``from pkg import mod`` counts pkg.mod."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "localspec.models":
                names.update(f"{node.module}.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


def _forbidden(tree: ast.AST) -> set[str]:
    return {
        n for n in _imported(tree)
        if n.split(".")[0] == "huggingface_hub" or (n.startswith("localspec.models.") and n not in ALLOWED)
    }  # fmt: skip


@pytest.mark.parametrize("path", INFERENCE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_inference_modules_import_no_downloader(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    assert not _forbidden(tree), f"{path.relative_to(ROOT)} imports {sorted(_forbidden(tree))}"


@pytest.mark.parametrize("source", [
    "from localspec.models.hub import pull_file",
    "from localspec.models import files, hub",
    "import huggingface_hub",
    "from huggingface_hub.errors import HfHubHTTPError",
    "def f():\n    from localspec.models.records import load_records",
])  # fmt: skip
def test_the_check_sees_each_way_to_the_downloader(source: str) -> None:
    assert _forbidden(ast.parse(source))


def test_the_check_lets_paths_hashes_and_names_through() -> None:
    ok = ("from localspec.models.files import known_sha256\n"
          "from localspec.models import registry\n"
          "import localspec.gguf.header\n")
    assert not _forbidden(ast.parse(ok))


def test_running_the_default_model_loads_no_downloader(model_path: Path) -> None:
    """Import every inference module and resolve the default model name in a fresh interpreter: neither
    huggingface_hub nor localspec.models.hub may be loaded, directly or through what they import."""
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in INFERENCE]
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "from localspec.models.files import known_sha256\n"
        "from localspec.models.sources import resolve_model\n"
        "known_sha256(resolve_model(None, progress=False).path)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'huggingface_hub' or m == 'localspec.models.hub'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", done.stdout
