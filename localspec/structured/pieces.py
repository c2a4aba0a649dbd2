"""A vocabulary's pieces as llguidance's tokenizer takes them, and the tokens that end a generation, read through
llama.cpp once per model and kept on disk: reading 262k pieces a token at a time costs 1.6-1.9 s on a 2-core CPU,
the file ~0.1 s, and every first constrained request of a process (``run --schema``, a server's first schema) paid it.

The file is keyed by the model's sha256 and llama-cpp-python's version (a new llama.cpp may render pieces otherwise);
one that cannot be read, or does not match the vocabulary's size, is read anew from the model and written again.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from localspec.engine import library_version
from localspec.models.files import atomic_write_bytes, known_sha256
from localspec.paths import cache_dir

if TYPE_CHECKING:
    from localspec.engine.vocab import Vocab

_FORMAT = 1  # in the file's name: a file written another way is not read


@dataclass(frozen=True, slots=True)
class Pieces:
    """Each token's bytes, control tokens marked with a leading 0xff (so that no string matches them), and the
    tokens that end a generation."""

    pieces: list[bytes]
    eog: list[int]


def cache_path(model: Path) -> Path:
    return cache_dir() / "grammar" / f"{known_sha256(model)[:16]}-{library_version()}-pieces{_FORMAT}.npz"


def pieces(vocab: Vocab, model: Path | None = None) -> Pieces:
    """``vocab``'s pieces: from the cache file of ``model`` (the GGUF ``vocab`` came from) where there is one that
    fits, else read from llama.cpp and, with a ``model``, kept (a cache that cannot be written costs only time)."""
    path = cache_path(model) if model is not None else None
    found = _read(path, vocab.n_tokens) if path is not None else None
    if found is None:
        found = _from_llama(vocab)
        if path is not None:
            with contextlib.suppress(OSError):
                _write(path, found)
    return found


def _from_llama(vocab: Vocab) -> Pieces:
    handle, size = vocab.handle, 16 * 1024
    buffer = ctypes.create_string_buffer(size + 1)
    special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    out: list[bytes] = []
    eog: list[int] = []
    for token in range(vocab.n_tokens):
        length = llama_cpp.llama_token_to_piece(handle, token, buffer, size, 0, True)
        piece = bytes(buffer[:max(0, length)])
        attr = llama_cpp.llama_vocab_get_attr(handle, token)
        # control tokens (and user-defined ones that look like them) are marked, so that no string matches them
        if attr & special or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        out.append(piece)
        if llama_cpp.llama_vocab_is_eog(handle, token):
            eog.append(token)
    return Pieces(out, eog)


def _write(path: Path, found: Pieces) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, lengths=np.fromiter(map(len, found.pieces), dtype=np.int64, count=len(found.pieces)),
             blob=np.frombuffer(b"".join(found.pieces), dtype=np.uint8), eog=np.array(found.eog, dtype=np.int64))
    atomic_write_bytes(path, buffer.getvalue())


def _read(path: Path, n_tokens: int) -> Pieces | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            lengths, blob, eog = data["lengths"], data["blob"].tobytes(), data["eog"].tolist()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # missing or damaged: read anew
        return None
    if len(lengths) != n_tokens or int(lengths.sum()) != len(blob) or (lengths < 0).any() \
            or any(not 0 <= t < n_tokens for t in eog):
        return None
    ends = np.cumsum(lengths).tolist()
    return Pieces([blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)], [int(t) for t in eog])
