"""Model files on disk: their sha256 (hashed once, then remembered), atomic writes, free space, sizes for people.

What inference needs of model files (a content hash to key caches by, a safe way to write a small file) lives
here, apart from the downloader, so that loading a model never imports huggingface_hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localspec.errors import UserError

HASH_BLOCK = 4 * 1024 * 1024


def say(message: str) -> None:
    """A progress or status line for people, on stderr (stdout stays for paths and JSON)."""
    print(f"localspec: {message}", file=sys.stderr, flush=True)


def format_size(n: int | None) -> str:
    if n is None:
        return "? B"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} PB"  # unreachable, keeps type checkers happy


def progress_bar(total: int | None, desc: str, enabled: bool) -> Any:
    """A byte-counting tqdm bar on stderr (a no-op object when disabled)."""
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
        disable=not enabled, leave=False, dynamic_ncols=True,
    )  # fmt: skip


def sha256_file(path: Path, *, progress: bool = False, label: str = "") -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    with path.open("rb") as f, progress_bar(total, f"verifying {label}".strip(), progress) as bar:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def is_sha256(value: str | None) -> bool:
    return bool(value) and re.fullmatch(r"[0-9a-fA-F]{64}", value or "") is not None


def sidecar_of(path: Path) -> Path:
    """The ``.verified.json`` beside a file localspec made itself (the embedded model): size, mtime, sha256."""
    return path.with_name(path.name + ".verified.json")


def recorded_sha256(sidecar: Path, target: Path) -> str | None:
    """The sha256 a sidecar records for ``target``, if the file still has the size and mtime it had then."""
    try:
        data = json.loads(sidecar.read_text())
        st = target.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or (data.get("size"), data.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return None
    sha = data.get("sha256")
    return sha if is_sha256(sha) else None


def known_sha256(path: Path) -> str:
    """A model file's sha256, hashing it only when nothing already knows it: a blob in the Hugging Face cache is
    named by it, the embedded model's sidecar records it, and other files are remembered per (size, mtime)."""
    blob = path.resolve().name
    if is_sha256(blob):
        return blob.lower()
    for sidecar in (sidecar_of(path), _hash_memo(path)):
        sha = recorded_sha256(sidecar, path)
        if sha is not None:
            return sha
    sha = sha256_file(path)
    write_sidecar(_hash_memo(path), path, sha)
    return sha


def _hash_memo(path: Path) -> Path:
    from localspec.paths import cache_dir

    return cache_dir() / "hashes" / (hashlib.sha1(str(path.resolve()).encode()).hexdigest() + ".json")


def write_sidecar(sidecar: Path, target: Path, sha: str) -> None:
    st = target.stat()
    atomic_write_text(sidecar, json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}))


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small file so that readers see the old or the new text, never half of it."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a small file so that readers see the old or the new bytes, never half of them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextmanager
def locked(path: Path, *, wait: float | None = None, waiting: Callable[[], None] | None = None) -> Iterator[bool]:
    """An exclusive lock on ``path``.lock while the block runs, where the platform has flock (elsewhere none); yields
    whether it is held. ``wait``: give up after that many seconds and run the block unlocked (a process stopped while
    holding it must not stall every other); ``waiting`` is called once if the lock is not free at first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            import fcntl
        except ImportError:
            yield False
            return
        held = _lock(fd, fcntl, wait, waiting)
        yield held
    finally:
        os.close(fd)  # closing releases the lock


def _lock(fd: int, fcntl: Any, wait: float | None, waiting: Callable[[], None] | None) -> bool:
    if wait is None and waiting is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = None if wait is None else time.monotonic() + wait
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if not told and waiting is not None:
                waiting()
                told = True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def check_free_space(needed: int, directory: Path, what: str) -> None:
    """A one-line UserError now, rather than a full disk halfway through writing ``needed`` bytes."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise UserError(
            f"not enough disk space for {what}: it needs {format_size(needed)} but {probe} has"
            f" {format_size(free)} free (free some space, or point HF_HUB_CACHE / LOCALSPEC_HOME elsewhere)"
        )
