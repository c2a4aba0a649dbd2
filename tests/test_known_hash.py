"""A model's sha256 names caches (calibration, early-exit models): it is computed only when nothing knows it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from localspec.models.files import known_sha256


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))


def test_a_hub_cache_blob_is_named_by_its_hash(tmp_path: Path) -> None:
    name = "ab" * 32
    blob = tmp_path / "blobs" / name
    blob.parent.mkdir()
    blob.write_bytes(b"not what the name says")  # trusted, not read: the hub verified it when it downloaded it
    link = tmp_path / "model.gguf"
    link.symlink_to(blob)
    assert known_sha256(link) == name


def test_a_verified_sidecar_is_used_instead_of_hashing(tmp_path: Path) -> None:
    from localspec.models.files import sidecar_of, write_sidecar

    model = tmp_path / "m.gguf"
    model.write_bytes(b"model bytes")
    write_sidecar(sidecar_of(model), model, "cd" * 32)
    assert known_sha256(model) == "cd" * 32


def test_other_files_are_hashed_once_per_size_and_mtime(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"first")
    first = known_sha256(model)
    assert first == hashlib.sha256(b"first").hexdigest()
    stat = model.stat()
    model.write_bytes(b"other")  # same size; put the old mtime back: the remembered hash is used
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert known_sha256(model) == first
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a changed file is hashed again
    assert known_sha256(model) == hashlib.sha256(b"other").hexdigest()
