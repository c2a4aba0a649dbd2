"""Where a registry model's file is, and getting it from its sources in order (the hub, packaged parts, embedded).

A model may have several sources (models.toml ``source = ["hub", "parts"]``, the default when it has both a repo
and parts): `pull` tries them in order, and a source that fails, the hub unreachable above all, hands over to the
next one with a line that says why. Files from the hub live in the Hugging Face cache; files localspec assembles
itself (packaged parts, the embedded model) in its own models folder, each with a sidecar that records its sha256.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import UserError
from localspec.models.entry import ModelEntry
from localspec.models.hub_cache import cached_path
from localspec.models.listing import shard_names
from localspec.models.parts import pull_parts, verified
from localspec.models.records import load_records
from localspec.models.registry import load_registry, names_list
from localspec.paths import models_dir


@dataclass(frozen=True)
class Fetched:
    """What `pull` got for one model: its file(s), from which source, and whether anything was transferred."""

    paths: list[Path]
    source: str
    downloaded: bool
    size: int


def assembled_path(entry: ModelEntry) -> Path:
    """Where a model assembled from packaged parts lives (the models folder, under its hub file name)."""
    return models_dir() / Path(entry.file).name


def local_path(entry: ModelEntry, *, progress: bool = True) -> Path:
    """Where a registry model lives on disk; embedded ones are assembled on demand, others must be pulled first."""
    if entry.embedded:
        from localspec.models.embedded import ensure_default_model

        return ensure_default_model(progress=progress)
    path = find_local(entry)
    if path is None:
        raise UserError(f"model '{entry.name}' is not downloaded yet: run `localspec pull {entry.name}`")
    return path


def find_local(entry: ModelEntry) -> Path | None:
    """The file of a model, from whichever source brought it: the hub cache, localspec's pull records, or the
    models folder (assembled from parts, checked by its sidecar: one stat), else None."""
    if entry.repo is not None:
        found = cached_path(entry.repo, entry.file, entry.revision)
        if found is not None:
            return found
        for r in load_records():
            same = r.get("repo") == entry.repo and r.get("file") == entry.file
            if same and entry.revision in (None, r.get("revision"), r.get("commit")) and \
                    Path(str(r.get("path"))).is_file():
                return Path(str(r["path"]))
    if entry.parts is not None and entry.sha256 and verified(assembled_path(entry), entry.sha256):
        return assembled_path(entry)
    return None


def fetch(entry: ModelEntry, *, revision: str | None = None, progress: bool = True,
          say: Callable[[str], None] | None = None) -> Fetched:
    """Get ``entry``'s file from its first source that works; the last source's error when none does.

    A file already assembled from parts is used without asking the hub (which may be unreachable: that is why
    there are parts). Ctrl-C is never taken for a failed source."""
    from localspec.models.files import say as default_say

    say = say or default_say
    if entry.parts is not None and entry.sha256 and verified(assembled_path(entry), entry.sha256):
        path = assembled_path(entry)
        return Fetched([path], "parts", False, path.stat().st_size)
    for i, kind in enumerate(entry.sources):
        try:
            return _fetch_from(kind, entry, revision, progress)
        except UserError as exc:
            from localspec.models.hub import DownloadInterrupted

            if isinstance(exc, DownloadInterrupted) or i == len(entry.sources) - 1:
                raise
            say(f"{entry.name}: {exc}; trying its next source ({entry.sources[i + 1]})")
    raise AssertionError("a model has at least one source")  # the registry guarantees it


def _fetch_from(kind: str, entry: ModelEntry, revision: str | None, progress: bool) -> Fetched:
    if kind == "embedded":
        from localspec.models.embedded import ensure_default_model

        path = ensure_default_model(progress=progress)
        return Fetched([path], kind, False, path.stat().st_size)
    if kind == "parts":
        assert entry.parts is not None and entry.sha256 is not None  # the registry checks both
        path = assembled_path(entry)
        fresh = pull_parts(entry.parts, path, entry.sha256, progress=progress)
        return Fetched([path], kind, fresh, path.stat().st_size)
    from localspec.models.hub import pull_file

    assert entry.repo is not None
    results = [pull_file(entry.repo, part, revision=revision or entry.revision, sha256=entry.sha256,
                         name=entry.name, progress=progress) for part in shard_names(entry.file)]
    return Fetched([r.path for r in results], kind, any(r.downloaded for r in results), sum(r.size for r in results))


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path


def _looks_like_path(spec: str) -> bool:
    return (
        os.sep in spec
        or (os.altsep is not None and os.altsep in spec)
        or spec.lower().endswith(".gguf")
        or (Path(spec).exists())
    )


def resolve_model(spec: str | None, *, progress: bool = True) -> ResolvedModel:
    """Turn ``--model`` (None, a path, or a registry name) into a local GGUF path, or a one-line UserError."""
    if spec is not None and _looks_like_path(spec):
        path = Path(spec).expanduser()
        if path.is_file():
            return ResolvedModel(name=path.stem, path=path)
        pulled = _pulled_file(spec)
        if pulled is None:
            raise UserError(f"model file not found: {spec} (check the path, or use a name from `localspec models`)")
        return ResolvedModel(name=spec, path=pulled)
    reg = load_registry()
    name = spec if spec is not None else reg.default
    if spec is None and name in reg.profiles and name not in reg.models:
        name = reg.profiles[name].target  # `default` may name a profile: use its target
    entry = reg.models.get(name)
    if entry is None:
        if name in reg.profiles:
            raise UserError(f"'{name}' is a profile (target {reg.profiles[name].target} with its drafter), not a"
                            f" model: did you mean --profile {name}?")
        raise UserError(
            f"unknown model '{name}': use a path to a .gguf file or one of {names_list(reg.models)} "
            "(see `localspec models`)"
        )
    return ResolvedModel(name=entry.name, path=local_path(entry, progress=progress))


def _pulled_file(spec: str) -> Path | None:
    """A file pulled by repo id, named as `localspec models` lists it: ``owner/name/path/in/repo.gguf``."""
    for r in load_records():
        if f"{r.get('repo')}/{r.get('file')}" == spec and Path(str(r.get("path"))).is_file():
            return Path(str(r["path"]))
    owner, _, rest = spec.partition("/")
    repo_name, _, file = rest.partition("/")
    return cached_path(f"{owner}/{repo_name}", file) if owner and repo_name and file else None
