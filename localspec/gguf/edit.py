"""Rewrite a GGUF's metadata arrays, copying its tensors untouched.

llama.cpp's quantizer (engine/rewrite.py) can drop blocks and override scalar keys, but not arrays: a model made of
some of a target's blocks needs its per-layer arrays cut to the kept blocks, and, where llama.cpp would otherwise
derive a per-layer property from the block index (Gemma 3's sliding-window layers), an array that says it outright.

Tensor offsets in a GGUF are relative to the start of the data section, so a new header only moves that start (to
the next multiple of the alignment); the data is streamed across as it is.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from localspec.gguf.header import _ARRAY, _BOOL, _SCALAR_FORMATS, _STRING, DEFAULT_ALIGNMENT, MAGIC, _Reader

ArrayValues = Sequence[bool] | Sequence[int] | Sequence[float]
_CHUNK = 16 << 20


def read_array(path: Path, key: str) -> tuple[int, list] | None:
    """A scalar array's element type and values (None where ``key`` is absent or not such an array)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        entries, _ = _entries(buf, path)
        for name, start, _end in entries:
            if name == key:
                r = _Reader(buf, path)
                r.pos = start
                return _scalar_array(r)
    return None


def set_arrays(source: Path, dest: Path, arrays: Mapping[str, tuple[int, ArrayValues]]) -> None:
    """Write ``source`` to ``dest`` with each key of ``arrays`` (key → (element type, values)) replaced or added."""
    with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        entries, infos_start = _entries(buf, source)
        kept = [bytes(buf[start:end]) for name, start, end in entries if name not in arrays]
        r = _Reader(buf, source)
        r.pos = infos_start
        tensor_count = struct.unpack_from("<Q", buf, 8)[0]
        for _ in range(tensor_count):  # name, dims, shape, type, offset: copied as they are
            r.skip_string()
            n_dims = r.scalar("<I")
            r.pos += 8 * n_dims + 4 + 8
        infos = bytes(buf[infos_start:r.pos])
        alignment = _alignment(buf, source, entries)
        old_data = -(-r.pos // alignment) * alignment
        added = [_array_entry(key, vtype, values) for key, (vtype, values) in arrays.items()]
        header = MAGIC + buf[4:8] + struct.pack("<QQ", tensor_count, len(kept) + len(added))
        header += b"".join(kept) + b"".join(added) + infos
        header += b"\0" * (-len(header) % alignment)
        with open(dest, "wb") as out:
            out.write(header)
            f.seek(old_data)
            shutil.copyfileobj(f, out, _CHUNK)


def _entries(buf: mmap.mmap, path: Path) -> tuple[list[tuple[str, int, int]], int]:
    """Each metadata entry as (key, start, end), its bytes being buf[start:end]; and where the tensor infos start."""
    if buf[:4] != MAGIC:
        raise ValueError(f"{path} is not a GGUF file")
    r = _Reader(buf, path)
    r.pos = 24  # magic, version, tensor count, metadata count
    entries = []
    for _ in range(struct.unpack_from("<Q", buf, 16)[0]):
        start = r.pos
        key = r.string()
        r.value(r.scalar("<I"))
        entries.append((key, start, r.pos))
    return entries, r.pos


def _alignment(buf: mmap.mmap, path: Path, entries: list[tuple[str, int, int]]) -> int:
    for key, start, _end in entries:
        if key == "general.alignment":
            r = _Reader(buf, path)
            r.pos = start
            r.string()
            value = r.value(r.scalar("<I"))
            return value if isinstance(value, int) and value > 0 else DEFAULT_ALIGNMENT
    return DEFAULT_ALIGNMENT


def _scalar_array(r: _Reader) -> tuple[int, list] | None:
    r.string()
    if r.scalar("<I") != _ARRAY:
        return None
    etype, count = r.scalar("<I"), r.scalar("<Q")
    if etype not in _SCALAR_FORMATS:
        return None
    return etype, [r.scalar(_SCALAR_FORMATS[etype]) for _ in range(count)]


def _array_entry(key: str, etype: int, values: ArrayValues) -> bytes:
    if etype not in _SCALAR_FORMATS or etype == _STRING:
        raise ValueError(f"only arrays of numbers or booleans can be written, not type {etype} ({key})")
    raw = key.encode()
    fmt = _SCALAR_FORMATS[etype]
    body = b"".join(struct.pack(fmt, bool(v) if etype == _BOOL else v) for v in values)
    return struct.pack("<Q", len(raw)) + raw + struct.pack("<IIQ", _ARRAY, etype, len(values)) + body


BOOL = _BOOL
