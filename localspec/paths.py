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

APP_NAME = "localspec"
HOME_ENV = "LOCALSPEC_HOME"


def _home() -> Path | None:
    # Read at call time, not import time: tests (and users) may set it after import.
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """User configuration (the user's ``models.toml``)."""
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    """Durable data: the embedded model and the record of what was pulled."""
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Things that can be thrown away and rebuilt."""
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """Model files localspec makes itself (the assembled embedded default)."""
    return data_dir() / "models"


def user_registry_path() -> Path:
    """The user's ``models.toml``, which extends and overrides the shipped one."""
    return config_dir() / "models.toml"


def pulled_records_path() -> Path:
    """The record of every file `localspec pull` fetched (the files themselves live in the hub cache)."""
    return data_dir() / "pulled.json"
