"""GGUF file names in a hub repo: the quant a name carries, the parts of a split file, and choosing one file.

Pure name logic, no network (the hub listing itself is ``hub.list_gguf_files``), so the registry can read a
model's quant without importing the downloader.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from localspec.errors import UserError
from localspec.models.files import format_size

_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Za-z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])", re.I)


def quant_of(filename: str) -> str | None:
    """The quantization named in a GGUF file name (``Qwen2.5-7B-Instruct-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    base = filename.rsplit("/", 1)[-1]
    shard = _SHARD_RE.match(base)
    stem = shard["stem"] if shard else base.removesuffix(".gguf")
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


def shard_names(filename: str) -> list[str]:
    """All parts of a split GGUF given its first part (``…-00001-of-00003.gguf``), else just the file."""
    folder, _, base = filename.rpartition("/")
    shard = _SHARD_RE.match(base)
    if not shard:
        return [filename]
    count = int(shard["count"])
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{shard['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


@dataclass(frozen=True)
class RemoteFile:
    """A GGUF file in a hub repo (or a split GGUF: ``parts`` > 1, ``path`` is its first part)."""

    path: str
    size: int | None
    parts: int = 1

    @property
    def quant(self) -> str | None:
        return quant_of(self.path)


def choose_file(repo: str, files: list[RemoteFile], pattern: str | None, quant: str) -> RemoteFile:
    """Pick one model file by exact name, glob, or (no pattern) quant preference; else say what to choose."""
    # Vision projectors (mmproj-*) are GGUFs too but not language models: never pick one by default.
    models = [f for f in files if not f.path.rsplit("/", 1)[-1].lower().startswith("mmproj")]
    if not files:
        raise UserError(f"{repo} has no .gguf files (is it a GGUF repo? try the '-GGUF' variant of its name)")
    if pattern is not None:
        exact = [f for f in files if pattern in (f.path, *shard_names(f.path))]
        matches = exact or [
            f
            for f in files
            if fnmatch.fnmatchcase(f.path, pattern) or fnmatch.fnmatchcase(f.path.rsplit("/", 1)[-1], pattern)
        ]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UserError(f"no file in {repo} matches '{pattern}'; it has: {_choices(files)}")
        raise UserError(f"'{pattern}' matches {len(matches)} files in {repo}: {_choices(matches)}; name one")
    if len(models) == 1:
        return models[0]
    wanted = [f for f in models if f.quant == quant.upper()]
    if len(wanted) == 1:
        return wanted[0]
    if not wanted:
        raise UserError(
            f"{repo} has no {quant.upper()} file; pick one with --quant or name the file: {_choices(models)}"
        )
    raise UserError(f"{repo} has {len(wanted)} {quant.upper()} files: {_choices(wanted)}; name one")


def _choices(files: list[RemoteFile]) -> str:
    return ", ".join(f"{f.path} ({format_size(f.size)})" for f in files)
