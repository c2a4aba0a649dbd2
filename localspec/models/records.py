"""What localspec pulled: the files are in the hub cache; this is the index `localspec models` reads."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.models.files import atomic_write_text
from localspec.paths import pulled_records_path


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
