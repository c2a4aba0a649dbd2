"""Read a GGUF file's header without llama.cpp.

We read it ourselves for three reasons: `localspec models` shows architecture, layers and context length
without loading weights; `pull` checks that a download really is a GGUF before calling it complete; and the
engine can turn "not a GGUF" / "truncated" into one clear line before llama.cpp prints pages of log and fails.

Layout (GGUF v2/v3, little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 metadata count, the
metadata key/value pairs, the tensor infos (name, dims, type, offset), padding to ``general.alignment``, then
the tensor data. Reference: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import ModelLoadError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types.
(
    _UINT8,
    _INT8,
    _UINT16,
    _INT16,
    _UINT32,
    _INT32,
    _FLOAT32,
    _BOOL,
    _STRING,
    _ARRAY,
    _UINT64,
    _INT64,
    _FLOAT64,
) = range(13)
_SCALAR_FORMATS: dict[int, str] = {
    _UINT8: "<B",
    _INT8: "<b",
    _UINT16: "<H",
    _INT16: "<h",
    _UINT32: "<I",
    _INT32: "<i",
    _FLOAT32: "<f",
    _BOOL: "<?",
    _UINT64: "<Q",
    _INT64: "<q",
    _FLOAT64: "<d",
}

# ggml tensor types: id -> (elements per block, bytes per block). Needed only to know how long the tensor data
# must be (truncation check); an unknown type makes that check fall back to a lower bound.
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
}

# `general.file_type` (llama_ftype) -> the quant name people use in file names.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}  # fmt: skip


class ArrayLength(int):
    """An array-valued metadata entry, kept as its length (per-layer arrays must match the block count)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the tensor data

    def nbytes(self) -> int | None:
        sizes = GGML_TYPE_SIZES.get(self.ggml_type)
        if sizes is None:
            return None
        block, type_size = sizes
        n = 1
        for d in self.shape:
            n *= d
        return n // block * type_size


@dataclass(frozen=True)
class GGUFHeader:
    """What the header says. Arrays in ``metadata`` are replaced by their length (token lists are huge)."""

    path: Path
    version: int
    tensor_count: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    data_offset: int  # where tensor data starts in the file
    file_size: int

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def _arch_int(self, key: str) -> int | None:
        value = self.metadata.get(f"{self.architecture}.{key}")
        return int(value) if isinstance(value, int) else None

    @property
    def block_count(self) -> int | None:
        """Number of transformer blocks (layers)."""
        return self._arch_int("block_count")

    @property
    def context_length(self) -> int | None:
        """The context length the model was trained for."""
        return self._arch_int("context_length")

    @property
    def file_type(self) -> str | None:
        """The quantization as a name (``Q4_K_M``), from ``general.file_type``."""
        value = self.metadata.get("general.file_type")
        if not isinstance(value, int):
            return None
        return FILE_TYPES.get(value, f"type {value}")

    @property
    def name(self) -> str | None:
        value = self.metadata.get("general.name")
        return value if isinstance(value, str) else None

    @property
    def has_chat_template(self) -> bool:
        return isinstance(self.metadata.get("tokenizer.chat_template"), str)

    @property
    def vocab_size(self) -> int | None:
        value = self.metadata.get("tokenizer.ggml.tokens")  # replaced by its length when read
        return value if isinstance(value, int) else None

    def data_end(self) -> int:
        """The file length the tensor table requires (a lower bound when a tensor type is unknown)."""
        end = self.data_offset
        for t in self.tensors:
            size = t.nbytes()
            end = max(end, self.data_offset + t.offset + (size or 0))
        return end


class _Reader:
    """Bounds-checked little-endian reads from a buffer; running off the end means the file is truncated."""

    def __init__(self, buf: bytes | mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def _truncated(self) -> ModelLoadError:
        return ModelLoadError(
            f"{self.path} is truncated: the GGUF header ends early (an interrupted download? pull it again)"
        )

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self._truncated()

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.scalar("<Q")
        self.need(n)
        self.pos += n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.scalar("<I")
            count = self.scalar("<Q")
            # Skip the elements: vocabularies have 100k+ strings we never need here; keep only the length.
            if etype in _SCALAR_FORMATS:
                size = struct.calcsize(_SCALAR_FORMATS[etype]) * count
                self.need(size)
                self.pos += size
            elif etype == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                # Nested arrays are legal but unused by llama.cpp models: read them element by element.
                for _ in range(count):
                    self.value(etype)
            return ArrayLength(count)
        raise ModelLoadError(f"{self.path} is not a valid GGUF file: unknown metadata value type {vtype}")


def is_gguf(path: str | Path) -> bool:
    """True if the file starts with the GGUF magic (cheap; says nothing about completeness)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_header(path: str | Path) -> GGUFHeader:
    """Parse the header of a GGUF file; :class:`ModelLoadError` with a one-line reason if it is not one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 4:
                raise ModelLoadError(
                    f"{path} is not a GGUF model file (it is {size} bytes long)"
                    if size
                    else f"{path} is empty, not a GGUF model file (an interrupted download? pull it again)"
                )
            # mmap: the metadata of a big model can be tens of MB (vocabularies); no need to read it all in.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path, size)
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{path} is a directory, not a GGUF model file") from None
    except PermissionError:
        raise ModelLoadError(f"cannot read {path}: permission denied") from None


def _parse(buf: mmap.mmap, path: Path, size: int) -> GGUFHeader:
    if buf[:4] != MAGIC:
        hint = " (it looks like a Git LFS pointer, not the model)" if buf[:7] == b"version" else ""
        raise ModelLoadError(f"{path} is not a GGUF model file (wrong magic bytes){hint}")
    r = _Reader(buf, path)
    r.pos = 4
    version = r.scalar("<I")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (expected 2 or 3)")
    tensor_count = r.scalar("<Q")
    kv_count = r.scalar("<Q")
    # Sanity bounds: garbage counts would otherwise make us loop for a very long time.
    if kv_count > size or tensor_count > size:
        raise ModelLoadError(f"{path} is not a valid GGUF file: impossible tensor/metadata counts")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = r.string()
        vtype = r.scalar("<I")
        metadata[key] = r.value(vtype)
    tensors = []
    for _ in range(tensor_count):
        name = r.string()
        n_dims = r.scalar("<I")
        if n_dims > 8:
            raise ModelLoadError(f"{path} is not a valid GGUF file: tensor {name!r} has {n_dims} dimensions")
        shape = tuple(r.scalar("<Q") for _ in range(n_dims))
        ggml_type = r.scalar("<I")
        offset = r.scalar("<Q")
        tensors.append(TensorInfo(name, shape, ggml_type, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_offset = (r.pos + alignment - 1) // alignment * alignment
    return GGUFHeader(
        path=path,
        version=version,
        tensor_count=tensor_count,
        metadata=metadata,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_size=size,
    )


def check_complete(path: str | Path) -> GGUFHeader:
    """Read the header and check the file holds all the tensor data it declares (catches truncation)."""
    header = read_header(path)
    needed = header.data_end()
    if header.file_size < needed:
        raise ModelLoadError(
            f"{header.path} is truncated: {header.file_size:,} bytes but its tensors need {needed:,}"
            " (an interrupted download? pull it again)"
        )
    return header
