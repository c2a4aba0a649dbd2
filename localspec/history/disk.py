"""A history on disk: one uncompressed .npz per model (its arrays as they are, so loading is a read, not a rebuild),
mode 600 (token ids decode to the text they came from), replaced atomically under a lock.

Two processes at once: each loads at start and keeps what it adds (``History.added``); saving takes the lock
(``locked``), and if the file changed since this process read it (``stamp``), reads it again and adds its own
sequences on top (history.py), so neither loses the other's. A file that cannot be read (damaged, another model's, a
newer format) is set aside beside it with one notice, never a crash: the history starts empty and the run goes on.
A file this user may not read or write is left alone (the caller says so in one line and keeps nothing on disk).

``localspec cache --clear`` leaves a mark (``CLEARED``, the time it cleared) before it removes the files: a process
that was running then drops, at its next save, everything it held from before that time, so a clear stays a clear.
This module knows files and arrays, not the History that uses them.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from localspec.history.store import NS, SEP, Shelf
from localspec.models import files
from localspec.paths import cache_dir

FORMAT = 1
CLEARED = ".cleared"  # in the history folder: when `localspec cache --clear` last ran (ns since the epoch)


def history_dir() -> Path:
    return cache_dir() / "history"


def history_path(model_hash: str) -> Path:
    """Where a model's history is kept: keyed like the calibration, by the model file's sha256."""
    return history_dir() / f"{model_hash[:16]}.npz"


def stamp(path: Path) -> tuple[int, int, int, str] | None:
    """Which write of the file this is: the id each write stores (an inode is reused, a size can repeat, and a
    file system's clock can give two writes one mtime), with the file's own numbers beside it."""
    try:
        st = path.stat()
        with np.load(path, allow_pickle=False) as data:
            written = str(json.loads(bytes(data["meta"]).decode("utf-8")).get("written", ""))
    except OSError:
        return None
    except Exception:  # damaged: whoever reads it next sets it aside
        written = ""
    return st.st_ino, st.st_size, st.st_mtime_ns, written


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside ``path`` (where the platform has flock; elsewhere the atomic replace alone)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the folder too: its names say which models ran
    with files.locked(path):
        yield


def model_of(path: Path) -> str:
    """The model a history file says it belongs to; Unreadable if it says nothing usable."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(json.loads(bytes(data["meta"]).decode("utf-8"))["model"])
    except OSError:
        raise
    except Exception as e:
        raise Unreadable(f"damaged ({type(e).__name__})") from None


class Unreadable(Exception):
    """The file is not a history this localspec can use (the message says why)."""


def read(path: Path, model: str, n_vocab: int | None = None) -> tuple[dict[str, Shelf], int]:
    """(shelves, next serial) from ``path``; Unreadable if it is damaged, another model's or a newer format (or
    holds token ids past ``n_vocab``); OSError if it cannot be opened at all (a permission: the file is not at
    fault, and is left where it is)."""
    with open(path, "rb") as f:  # an OSError here is the caller's to say, never "damaged"
        return _read(f, model, n_vocab)


def _read(f: BinaryIO, model: str, n_vocab: int | None) -> tuple[dict[str, Shelf], int]:
    try:
        with np.load(f, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            if not isinstance(meta, dict) or not isinstance(meta.get("format"), int):
                raise Unreadable("no format")
            if meta["format"] > FORMAT:
                raise Unreadable(f"written by a newer localspec (format {meta['format']})")
            if meta.get("model") != model:
                raise Unreadable("it belongs to another model")
            if list(meta.get("ns", [])) != list(NS):
                raise Unreadable("indexed another way")
            shelves = {}
            for i, scope in enumerate(meta["scopes"]):
                tags = data[f"s{i}.tags"] if f"s{i}.tags" in data.files else np.empty(0, np.int64)  # older: none
                shelf = Shelf(tokens=data[f"s{i}.tokens"], starts=data[f"s{i}.starts"], serials=data[f"s{i}.serials"],
                              tags=tags, keys={n: data[f"s{i}.k{n}"] for n in NS},
                              positions={n: data[f"s{i}.p{n}"] for n in NS})
                _check(shelf, n_vocab)
                shelves[str(scope)] = shelf
            return shelves, int(meta["serial"])
    except Unreadable:
        raise
    except Exception as e:  # anything a damaged zip or array can raise (BadZipFile, ValueError, ...): never a crash
        raise Unreadable(f"damaged ({type(e).__name__})") from None


def _check(shelf: Shelf, n_vocab: int | None = None) -> None:
    """Cheap proofs that the arrays fit together (a few ms at a million tokens): a lookup can then never index out
    of them, and never draft an id the model does not have (llama_decode would refuse the pass). The file has no
    checksum: these are what stands between a crafted file and the decoder. (A wrong draft of real ids would only
    cost a pass: verification keeps the output the model's.)"""
    t, starts = shelf.tokens, shelf.starts
    ok = (t.dtype == np.int32 and t.ndim == 1 and starts.dtype == np.int64 and starts.ndim == 1
          and shelf.serials.dtype == np.int64 and len(starts) == len(shelf.serials)
          and shelf.tags.dtype == np.int64 and shelf.tags.shape == shelf.serials.shape
          and (not len(starts) or (starts[0] == 0 and starts[-1] < len(t))))
    if ok and len(t):
        # ids in range (SEP the only negative), each sequence ends with SEP where the next one starts
        ok = (int(t.min()) >= SEP and (n_vocab is None or int(t.max()) < n_vocab) and int(t[-1]) == SEP
              and bool(np.all(starts[1:] > starts[:-1])) and bool(np.all(t[starts[1:] - 1] == SEP)))
    for n in NS:
        k, p = shelf.keys[n], shelf.positions[n]
        ok = ok and k.dtype == np.uint64 and p.dtype == np.int32 and k.shape == p.shape and k.ndim == 1
        ok = ok and (not len(p) or (int(p.min()) >= n and int(p.max()) < len(t) and bool(np.all(k[1:] >= k[:-1]))))
    if not ok:
        raise Unreadable("damaged (arrays disagree)")


def set_aside(path: Path, why: str) -> str:
    """Move the unreadable file out of the way (kept, for whoever wants to look); the notice to show."""
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
    except OSError:
        return f"the history at {path} cannot be read ({why}) nor moved: starting afresh, in memory"
    return f"the history at {path} cannot be read ({why}): set aside as {aside.name}, starting afresh"


def write(path: Path, model: str, shelves: dict[str, Shelf], serial: int) -> None:
    """``shelves`` as the file at ``path``: written beside it, then renamed over it (a reader sees old or new)."""
    scopes = list(shelves)
    meta = {"format": FORMAT, "model": model, "scopes": scopes, "serial": serial, "ns": list(NS),
            "written": uuid.uuid4().hex}
    arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)}
    for i, scope in enumerate(scopes):
        shelf = shelves[scope]
        arrays[f"s{i}.tokens"], arrays[f"s{i}.starts"] = shelf.tokens, shelf.starts
        arrays[f"s{i}.serials"], arrays[f"s{i}.tags"] = shelf.serials, shelf.tags
        for n in NS:
            arrays[f"s{i}.k{n}"], arrays[f"s{i}.p{n}"] = shelf.keys[n], shelf.positions[n]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mkstemp: mode 600
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())  # the data on disk before the name points at it: a crash leaves old or new
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        _sync_folder(path.parent)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """The rename itself on disk (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe() -> list[dict[str, object]]:
    """What is kept, per model file: its size, requests and tokens per scope (for ``localspec cache``)."""
    out: list[dict[str, object]] = []
    folder = history_dir()
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.npz")):
        entry: dict[str, object] = {"path": str(path), "bytes": path.stat().st_size}
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(bytes(data["meta"]).decode("utf-8"))
                entry["model"] = meta.get("model", "")
                entry["scopes"] = {str(scope): {"requests": int(len(data[f"s{i}.starts"])),
                                                "tokens": int(len(data[f"s{i}.tokens"]) - len(data[f"s{i}.starts"]))}
                                   for i, scope in enumerate(meta.get("scopes", []))}
        except OSError as e:  # not this user's to read: said as such (nothing is set aside for it)
            entry["error"] = f"cannot be read ({e.strerror or type(e).__name__})"
        except Exception as e:  # a damaged file is shown as such; the next run sets it aside
            entry["error"] = f"unreadable ({type(e).__name__})"
        out.append(entry)
    return out


def leftovers() -> list[dict[str, object]]:
    """Files beside the histories that hold text too: files set aside (``.bad-*``) and writes a crash left
    (``.tmp``); ``localspec cache`` shows them and ``--clear`` removes them."""
    folder = history_dir()
    if not folder.is_dir():
        return []
    out: list[dict[str, object]] = []
    for path in sorted(folder.iterdir()):
        kind = "set aside" if ".bad-" in path.name else "unfinished write" if path.name.endswith(".tmp") else None
        if kind is not None and path.is_file():
            out.append({"path": str(path), "bytes": path.stat().st_size, "kind": kind})
    return out


def cleared_at(folder: Path) -> int:
    """When the histories in ``folder`` were last cleared (ns since the epoch; 0: never)."""
    try:
        return int((folder / CLEARED).read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        return 0


def _owner(path: Path) -> Path | None:
    """The history whose lock guards ``path``: itself, or the one an unfinished write was for."""
    name = path.name
    if name.endswith(".npz"):
        return path
    if name.startswith(".") and name.endswith(".tmp") and ".npz." in name:
        return path.with_name(name[1 : name.index(".npz.") + 4])
    return None


def clear() -> list[Path]:
    """Remove every kept history (and anything set aside); the files removed. The mark goes first, so a process
    that saves after it drops what it held from before; each file goes under its lock (a writer's lock file stays:
    removing it would let a second writer in beside the first)."""
    folder = history_dir()
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    mark = folder / CLEARED
    tmp = mark.with_name(f"{CLEARED}.{uuid.uuid4().hex}.new")
    tmp.write_text(str(time.time_ns()), encoding="ascii")
    os.replace(tmp, mark)
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.endswith(".lock") or path.name == CLEARED:
            continue
        owner = _owner(path)
        with locked(owner) if owner is not None else contextlib.nullcontext():
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
