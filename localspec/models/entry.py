"""One model of the registry (models.toml): its name, its file and where to get it. Plain data, read by the
registry and by the sources that find and fetch the file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.models.listing import quant_of
from localspec.models.parts import PartsSource


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str
    repo: str | None = None  # hub repo id; None for the embedded model
    revision: str | None = None
    sha256: str | None = None
    family: str | None = None
    notes: str = ""
    sources: tuple[str, ...] = ("hub",)  # tried in this order by `pull`: hub, parts (models/parts.py), embedded
    defined_in: Path | None = None
    parts: PartsSource | None = None

    @property
    def source(self) -> str:
        return self.sources[0]

    @property
    def embedded(self) -> bool:
        return self.source == "embedded"

    @property
    def quant(self) -> str | None:
        return quant_of(self.file)
