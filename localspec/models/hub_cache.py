"""The Hugging Face hub cache on disk: where it is and which files of a repo are in it. No network.

The registry finds pulled models here. Lookups go through huggingface_hub's own offline resolution
(refs, snapshots) rather than a copy of its layout rules, imported only when a hub model is looked up.
"""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The hub cache: explicit, else HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default.

    Read from the environment at call time (huggingface_hub reads it once at import), so a process that sets
    these variables later, tests included, still gets what it asked for.
    """
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


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


def cached_gguf_files(repo: str, cache_dir: str | Path | None = None) -> list[str]:
    """GGUF files of ``repo`` in the hub cache, any revision (their paths inside the repo)."""
    from huggingface_hub.file_download import repo_folder_name

    snapshots = hub_cache_dir(cache_dir) / repo_folder_name(repo_id=repo, repo_type="model") / "snapshots"
    try:
        found = {str(f.relative_to(s)) for s in snapshots.iterdir() for f in s.rglob("*.gguf") if f.is_file()}
    except OSError:
        return []
    return sorted(found)
