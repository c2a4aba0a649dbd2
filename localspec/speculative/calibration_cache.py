"""The calibration's cache: its figures as a file (the format, reading a damaged one as none, writing one
atomically), where each kind of figures lives, and ``cached``, which reads them or measures them anew.
speculative/calibrate.py measures; this module keeps."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar

from localspec.engine import Device, library_version
from localspec.models.files import atomic_write_text, locked
from localspec.models.files import say as to_stderr
from localspec.paths import cache_dir
from localspec.speculative.costs import MIN_PASSES, PassCosts

_METHOD = "q5"  # in the cache file's name: figures measured another way are not reused
_IMPROVES = 0.95  # a live figure replaces a stored one when it is at least 5% lower
# how long a start waits for another process measuring the same figures: one stopped mid-measurement (Ctrl-Z) must
# not hold every later start; past this, both measure
_WAIT_SECONDS = 120.0


@dataclass
class Calibration:
    """Seconds per target pass by tokens in the pass, for one model on one device setting, with how and when each
    figure was measured, and whether the machine was quiet enough to trust them."""

    seconds: dict[int, float]
    measured: dict[int, str]  # size → how and when ("calibration, 2nd lowest of 5 rounds, 2026-11-23 20:31")
    device: str
    provisional: str = ""  # why the figures may be too high ("": measured on a quiet machine)
    attempts: int = 1  # measurements so far that came out provisional, plus one
    path: Path | None = field(default=None, compare=False)
    # the figures as the last measurement took them, which live passes never change (``improve`` leaves them): a
    # seeded sampled request prices on these, so its pass sizes do not follow what earlier runs wrote back
    as_measured: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.as_measured:  # a file written before they were kept: its figures as read stand for them
            self.as_measured = dict(self.seconds)

    def to_json(self) -> str:
        return json.dumps({
            "format": 2, "device": self.device, "provisional": self.provisional, "attempts": self.attempts,
            "seconds_by_batch": {str(n): s for n, s in sorted(self.seconds.items())},
            "measured": {str(n): m for n, m in sorted(self.measured.items())},
            "as_measured_by_batch": {str(n): s for n, s in sorted(self.as_measured.items())},
        }, indent=1)

    @classmethod
    def read(cls, path: Path) -> Calibration | None:
        """The calibration cached at ``path``; None if there is none or it cannot be read (it is measured anew)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            seconds = {int(n): float(s) for n, s in data["seconds_by_batch"].items()}
            measured = {int(n): str(m) for n, m in data.get("measured", {}).items()}
            as_measured = {int(n): float(s) for n, s in data.get("as_measured_by_batch", {}).items()}
            if not seconds or sorted(seconds) != list(range(1, len(seconds) + 1)) or min(seconds.values()) <= 0:
                return None  # damaged: measured anew
            if as_measured and (sorted(as_measured) != sorted(seconds) or min(as_measured.values()) <= 0):
                as_measured = {}  # damaged: the figures as read stand for them
            return cls(seconds, measured, str(data.get("device", "")), str(data.get("provisional", "")),
                       int(data.get("attempts", 1)), path, as_measured)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save(self) -> bool:
        """Write the file; False if it cannot be written (the figures still serve this run)."""
        if self.path is None:
            return False
        try:
            atomic_write_text(self.path, self.to_json())
        except OSError:
            return False
        return True

    def improve(self, costs: PassCosts) -> list[int]:
        """Take what live passes proved: a size's own figure where it is clearly lower than the stored one (a live
        pass costs at least the bare pass), and, where the live level says every pass runs faster than calibrated,
        the stored figure at that level for the sizes no pass used (else, next time, the sizes written back would
        set the level at 1 again and the rest would look as dear as before). Returns the sizes changed."""
        when, level, live = stamp(), costs.level(), costs.live()
        changed = []
        for n, stored in self.seconds.items():
            seconds, passes = live.get(n, (0.0, 0))
            if passes >= MIN_PASSES:
                how = f"live, 25th percentile of {passes} passes, {when}"
            else:
                seconds, how = stored * level, f"{self.measured.get(n, 'calibration')}; × {level:.2f} live, {when}"
            if seconds < stored * _IMPROVES:
                self.seconds[n], self.measured[n] = seconds, how
                changed.append(n)
        return changed


def cache_path(model_hash: str, device: Device, n_max: int, what: str) -> Path:
    """Where the figures of ``what`` ("argmax", "logits", either + "-steady"; "reads"; "shapes") for passes of up to
    ``n_max`` tokens of this model on ``device`` are cached. Keep the names as they are: a new localspec finds the
    figures a user's machine measured before (a new llama-cpp-python, whose version is in them, measures anew)."""
    # passes that return token ids (backend sampling) and passes that return logits cost differently; the device is
    # in the name because the CPU behind a machine can change from one day to the next
    slug = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")[:48] or "unknown"
    name = (f"{model_hash[:16]}-{slug}-t{device.threads}-g{device.gpu_layers}-n{n_max}-{library_version()}-{_METHOD}"
            f"-{what}.json")
    return cache_dir() / "calibration" / name


class _Cacheable(Protocol):
    def to_json(self) -> str: ...


C = TypeVar("C", bound=_Cacheable)


def cached(path: Path, read: Callable[[Path], C | None], measure: Callable[[], C], what: str, *, again: bool = False,
           say: Callable[[str], None] | None = None) -> C:
    """The figures cached at ``path`` (``read``: None where there are none or they cannot be used), or measured now,
    saying ``what`` is measured, and cached (a cache that cannot be written costs only the next run's measurement)."""
    found = None if again else read(path)
    if found is None:
        with measuring(path, say):
            found = None if again else read(path)  # measured by another process while this one waited
            if found is None:
                (say or to_stderr)(what)
                found = measure()
                with contextlib.suppress(OSError):
                    atomic_write_text(path, found.to_json())
    return found


@contextlib.contextmanager
def measuring(path: Path, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Held while the figures at ``path`` are measured: localspec processes that start together on a fresh machine
    (a server and a run, a suite's workers) measure them once, and each measures undisturbed by the others'
    measuring; the others wait, then read what it wrote."""
    def waiting() -> None:
        (say or to_stderr)("another localspec process is measuring this machine: waiting for its figures")

    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # a read-only cache folder: measured unlocked, as nothing is kept there
            stack.enter_context(locked(path, wait=_WAIT_SECONDS, waiting=waiting))
        yield


def stamp() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M")
