"""Where localspec keeps its files.

Everything goes through these functions so that one environment variable, ``LOCALSPEC_HOME``, can move all of
it (tests use it so they never touch ``~``). Without it the platform's usual places are used (platformdirs).
Downloaded hub models do *not* live here: they go to the shared Hugging Face cache (``HF_HOME`` /
``HF_HUB_CACHE``) so other tools can reuse them; only the embedded default model and small records do.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from localspec.errors import UserError

APP_NAME = "localspec"
HOME_ENV = "LOCALSPEC_HOME"


def _home() -> Path | None:
    # Read at call time, not import time: tests (and users) may set it after import.
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """User configuration (the user's ``models.toml``); only read, so it need not be writable."""
    home = _home()
    path = home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    return usable_dir(path, "configuration", writable=False)


def data_dir() -> Path:
    """Durable data: the embedded model and the record of what was pulled."""
    home = _home()
    return usable_dir(home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)), "data")


def cache_dir() -> Path:
    """Things that can be thrown away and rebuilt."""
    home = _home()
    path = home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return usable_dir(path, "cache")


def usable_dir(path: Path, what: str, *, writable: bool = True, fix: str | None = None) -> Path:
    """``path``, once it is sure that it is (or can be made) a folder localspec can use; else one UserError.

    Checked up front because the failure otherwise surfaces deep inside whatever first writes there, as a
    traceback (NotADirectoryError for LOCALSPEC_HOME=/dev/null/x). Costs a few stat calls; creates nothing.
    """
    fix = fix or (f"set {HOME_ENV} to a folder you can write" if _home() else f"fix it, or set {HOME_ENV}"
                  " to a folder you can write")
    for probe in (path, *path.parents):
        if probe.is_dir():
            if writable and not os.access(probe, os.W_OK | os.X_OK):
                raise UserError(f"cannot use {path} for localspec's {what}: {probe} is not writable; {fix}")
            return path
        if probe.exists() or probe.is_symlink():  # a file, a dangling link: nothing can be made below it
            raise UserError(f"cannot use {path} for localspec's {what}: {probe} is not a folder; {fix}")
    return path


def models_dir() -> Path:
    """Model files localspec makes itself (the assembled embedded default)."""
    return data_dir() / "models"


def user_registry_path() -> Path:
    """The user's ``models.toml``, which extends and overrides the shipped one."""
    return config_dir() / "models.toml"


def pulled_records_path() -> Path:
    """The record of every file `localspec pull` fetched (the files themselves live in the hub cache)."""
    return data_dir() / "pulled.json"
