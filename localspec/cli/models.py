"""`localspec models`: what models and profiles exist, which are on disk, and what their GGUF headers say."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from localspec.cli import app, user_errors

if TYPE_CHECKING:
    from localspec.models.registry import Profile, Registry


@dataclass
class ModelRow:
    name: str
    status: str  # "embedded" | "downloaded" | "not downloaded"
    file: str
    repo: str | None
    size: int | None = None
    quant: str | None = None
    architecture: str | None = None
    layers: int | None = None
    context_length: int | None = None
    path: str | None = None
    notes: str = ""


@app.command()
def models(
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout (for scripts)."),
    paths: bool = typer.Option(False, "--paths", help="Also print where registries, records and files live."),
) -> None:
    """List known and downloaded models (with what their GGUF headers say) and the target/draft profiles.

    \b
    Examples:
      localspec models
      localspec models --json | jq -r '.models[] | select(.path) | .path'
      localspec models --paths      # where models.toml and the files live

    Add models and profiles in your own models.toml (see --paths and docs/models.md).

    An entry there with the name of a shipped one replaces it. Get a model with `localspec pull NAME`.
    """
    with user_errors():
        from localspec.models.registry import load_registry

        reg = load_registry()
        rows = _model_rows(reg)
        profiles = list(reg.profiles.values())
        if as_json:
            out = {
                "default": reg.default,
                "models": [asdict(r) for r in rows],
                "profiles": [
                    {k: v for k, v in asdict(p).items() if k != "defined_in"} | {"defined_in": str(p.defined_in)}
                    for p in profiles
                ],
                "registries": [str(f) for f in reg.files],
            }
            print(json.dumps(out, indent=1))
            return
        _print_models(rows, reg.default)
        print()
        _print_profiles(profiles)
        if paths:
            _print_paths(reg.files)


def _model_rows(reg: Registry) -> list[ModelRow]:
    from localspec.models.listing import quant_of
    from localspec.models.records import load_records
    from localspec.models.sources import find_local

    rows: list[ModelRow] = []
    seen: set[str] = set()
    for e in reg.models.values():
        if e.embedded:
            local = _embedded_path()
            status = "embedded"
        else:
            local = find_local(e)
            status = "downloaded" if local else "not downloaded"
        row = ModelRow(e.name, status, e.file, e.repo, quant=e.quant, notes=e.notes)
        if local is not None:
            _fill_from_file(row, local)
            seen.add(str(local))
        rows.append(row)
    # Files pulled by repo id (not by a registry name) are listed too, under repo/file.
    for r in load_records():
        path = Path(str(r.get("path")))
        if str(path) in seen or not path.is_file():
            continue
        seen.add(str(path))
        file = str(r.get("file"))
        row = ModelRow(f"{r.get('repo')}/{file}", "downloaded", file, str(r.get("repo")), quant=quant_of(file))
        _fill_from_file(row, path)
        rows.append(row)
    return rows


def _embedded_path() -> Path | None:
    # Do not assemble 253 MB just to list it: report the file if it is already there.
    from localspec.models.embedded import embedded_model_path

    path = embedded_model_path()
    return path if path is not None and path.is_file() else None


def _fill_from_file(row: ModelRow, path: Path) -> None:
    from localspec.errors import ModelLoadError
    from localspec.gguf.header import read_header

    row.path = str(path)
    row.size = path.stat().st_size
    try:
        h = read_header(path)
    except ModelLoadError as exc:
        row.notes = f"unreadable: {exc}"
        return
    row.quant = h.file_type or row.quant
    row.architecture = h.architecture
    row.layers = h.block_count
    row.context_length = h.context_length


def _print_models(rows: list[ModelRow], default: str) -> None:
    from localspec.models.files import format_size

    print("MODELS")
    header = ("", "NAME", "STATUS", "SIZE", "QUANT", "ARCH", "LAYERS", "CTX", "FILE / PATH")
    table = [header]
    for r in rows:
        table.append(
            (
                "*" if r.name == default else "",
                r.name,
                r.status,
                format_size(r.size) if r.size is not None else "-",
                r.quant or "-",
                r.architecture or "-",
                str(r.layers) if r.layers is not None else "-",
                str(r.context_length) if r.context_length is not None else "-",
                r.path or (f"{r.repo}/{r.file}" if r.repo else r.file),
            )
        )
    _print_table(table)
    print("  (* = default; get one with `localspec pull NAME`)")


def _print_profiles(profiles: list[Profile]) -> None:
    print("PROFILES (use with --profile NAME)")
    table = [("", "NAME", "TARGET", "DRAFTER", "DRAFT", "K", "EXIT", "NOTES")]
    for p in profiles:
        table.append(
            (
                "",
                p.name,
                p.target,
                p.drafter,
                p.draft or "-",
                str(p.k) if p.k is not None else "auto",
                str(p.exit_layer) if p.exit_layer is not None else "-",
                p.notes,
            )
        )
    _print_table(table)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
        print(" ".join(cells) + " " + r[-1])


def _print_paths(files: list[Path]) -> None:
    from localspec.models.hub_cache import hub_cache_dir
    from localspec.paths import models_dir, pulled_records_path, user_registry_path

    print()
    print("PATHS")
    for f in files:
        print(f"  registry:        {f}")
    if user_registry_path() not in files:
        print(f"  user registry:   {user_registry_path()} (create it to add models and profiles)")
    print(f"  hub cache:       {hub_cache_dir()}")
    print(f"  embedded model:  {models_dir()}")
    print(f"  pull records:    {pulled_records_path()}")
    sys.stdout.flush()
