"""`localspec pull`: listing a repo's GGUF files on the Hugging Face hub and downloading one, resumably.

Hub downloads are built on huggingface_hub's own primitives (file metadata, its HTTP `http_get`, its cache
layout and locks) so that files land in the standard hub cache (``HF_HOME`` / ``HF_HUB_CACHE``) where other
tools find them, and ``HF_ENDPOINT`` / ``HF_TOKEN`` / ``HF_HUB_OFFLINE`` work as everywhere else. We do not
call ``hf_hub_download`` for the transfer itself because since huggingface_hub 1.18 it throws away a partial
file when interrupted (issue #4196): a 5 GB download cut at 90% would start over. Instead we append to the
cache's ``blobs/<etag>.incomplete`` with a ``Range`` request, verify (size, sha256, GGUF header) and only then
rename it to the blob, and let ``hf_hub_download`` link it into ``snapshots/`` as it would have.

The downloader: nothing on the inference path imports this module (tests/test_inference_imports.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from localspec._version import __version__
from localspec.errors import ModelLoadError, UserError
from localspec.gguf.header import check_complete
from localspec.models.files import check_free_space, format_size, is_sha256, say, sha256_file
from localspec.models.hub_cache import cached_gguf_files, cached_path, hub_cache_dir
from localspec.models.listing import RemoteFile, shard_names
from localspec.models.records import PullResult, load_records, record_pull
from localspec.paths import usable_dir


class DownloadInterrupted(UserError):
    """Ctrl-C during a download: the partial file is kept for the next run, exit code as for SIGINT."""

    exit_code = 130


# --------------------------------------------------------------------------------------------------
# Listing a repo's GGUF files
# --------------------------------------------------------------------------------------------------


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


def hub_endpoint(endpoint: str | None = None) -> str:
    """The hub URL: explicit, else HF_ENDPOINT (read now, like the cache folder), else the library default."""
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


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
            say(f"cannot reach the hub; using the cached {filename}")
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

        expected_sha = (sha256 or (meta.etag if is_sha256(meta.etag) else "")).lower() or None
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
                    check_free_space(meta.size - have, blob.parent, filename)
                if have and progress:
                    say(f"resuming {filename} at {format_size(have)} of {format_size(meta.size)}")
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
            sha = blob_name if is_sha256(blob_name) else None
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
