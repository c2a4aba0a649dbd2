"""A model's history: a shelf per scope, bounded over all of them (the oldest sequence out first), fed when a
generation ends, and kept on disk where the face keeps it (disk.py).

Scopes: ``LOCAL_SCOPE`` for the user's own work (run, chat, batch, the Python API); ``key:<hash>`` for a server's
API key (the key itself is never stored, only a short hash of it); ``server`` for a server without keys.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localspec.history import disk
from localspec.history.store import DEFAULT_MAX_TOKENS, NS, Match, Shelf

LOCAL_SCOPE = "local"
SERVER_SCOPE = "server"
_MIN_TOKENS = 8  # a sequence shorter than this teaches nothing worth keeping
_RECENT_FED = 8  # per scope, the last sequences fed: a conversation that comes back adds only its new part
_OVERLAP = 16  # tokens of the old part kept before the new one (the longest n-gram indexed)
# a long-running process (serve --keep-history) saves once this many requests wait, or the oldest waited this long:
# a crash loses no more, and each save's merge is small
SAVE_REQUESTS = 64
SAVE_SECONDS = 60.0
_FED_SCOPES = 64  # scopes whose recent sequences are remembered (a server with many keys: the most recent ones)
_NONE = Shelf()  # what a view of a scope without a shelf reads: nothing


def scope_of_key(api_key: str | None) -> str:
    """The scope of a server's requests: one per API key (a hash: the file must not hold the key)."""
    if api_key is None:
        return SERVER_SCOPE
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


@dataclass
class Added:
    """A sequence this process fed since it last saved (merged into the file's newer content when saving)."""

    scope: str
    tokens: np.ndarray  # int32: a fraction of a Python list's size (a server may feed millions before a save)
    at: int  # when it was fed (ns since the epoch): a clear after that drops it
    tag: int = 0  # whose it is (Shelf.tags)


@dataclass
class _Fed:
    """One of a scope's last sequences fed, to find a conversation that comes back; ``since``: the serial of the
    oldest sequence its tokens are kept in (once that one is dropped, the conversation must be fed whole again)."""

    tokens: np.ndarray
    since: int


@dataclass
class History:
    """Every scope's shelf for one model. ``path``: where it is kept (None: in memory only). ``model``: the model
    file's sha256 (a file of another model is set aside, never used). ``n_vocab``: the model's vocabulary (a file
    with ids past it is set aside)."""

    model: str
    path: Path | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    shelves: dict[str, Shelf] = field(default_factory=dict)
    serial: int = 0  # the next sequence's serial: order of arrival over all scopes
    # what this process added since it last saved, at most ``max_tokens`` of it (older would be dropped anyway)
    added: list[Added] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # a bench feeds by hand (each prompt after all its runs): the hooks then do nothing
    frozen: bool = False
    stamp: tuple[int, int, int, str] | None = None  # the file as this process last read or wrote it (disk.py)
    synced: int = 0  # when this process last read or wrote the file (ns): a clear after it voids what it holds
    n_vocab: int | None = None
    _fed: dict[str, list[_Fed]] = field(default_factory=dict, repr=False)
    _floor: dict[str, int] = field(default_factory=dict, repr=False)  # per scope, the lowest epoch a new shelf takes
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(
        cls, model: str, path: Path | None, max_tokens: int = DEFAULT_MAX_TOKENS, n_vocab: int | None = None,
    ) -> History:
        """The history kept at ``path`` (empty if there is none, or if it was set aside: see ``notices``). Where
        the file or its folder cannot be used (a permission, a read-only disk), one notice, and the history is kept
        in memory only: never a traceback, and never a write over a file it could not read."""
        history = cls(model, path, max_tokens, n_vocab=n_vocab)
        if path is None:
            return history
        try:
            with disk.locked(path):  # the stamp of the very write read (a save compares it)
                history.synced = time.time_ns()
                if path.exists():
                    history.stamp = disk.stamp(path)
                    history._adopt(*history._read(path))
        except OSError as e:
            history.path = None
            history.shelves, history.serial = {}, 0
            history.notices.append(f"the history at {path} cannot be used ({_why(e)}): this run drafts from its own "
                                   "requests only and keeps nothing on disk")
        history.bound()
        return history

    def _read(self, path: Path) -> tuple[dict[str, Shelf], int]:
        """The file's shelves and next serial; nothing (and the file set aside, with a notice) if unusable. An
        OSError (the file cannot be opened) is the caller's."""
        try:
            return disk.read(path, self.model, self.n_vocab)
        except disk.Unreadable as e:
            self.notices.append(disk.set_aside(path, str(e)))
            return {}, 0

    def _adopt(self, shelves: dict[str, Shelf], serial: int) -> None:
        """Hold ``shelves`` (read from the file) instead of this process's: each takes an epoch past any its scope
        had, so a drafter following a place in the old arrays never reads the new ones at it."""
        for scope in self.shelves:
            self._retire(scope)
        for scope, shelf in shelves.items():
            shelf.epoch = max(shelf.epoch, self._floor.get(scope, 0))
        self.shelves = shelves
        self.serial = max(self.serial, serial)

    def _retire(self, scope: str) -> None:
        shelf = self.shelves.get(scope)
        if shelf is not None:
            self._floor[scope] = max(self._floor.get(scope, 0), shelf.epoch + 1)

    def view(self, scope: str = LOCAL_SCOPE) -> HistoryView:
        return HistoryView(self, scope)

    def shelf(self, scope: str) -> Shelf:
        shelf = self.shelves.get(scope)
        if shelf is None:
            shelf = self.shelves[scope] = Shelf(epoch=self._floor.get(scope, 0))
        return shelf

    def feed(self, sequence: Sequence[int], scope: str = LOCAL_SCOPE, *, force: bool = False, tag: int = 0) -> None:
        """Keep ``sequence`` (a prompt and what was generated after it) for later lookups in ``scope``; ``tag``:
        whose it is, to forget it by (``forget``: a chat's conversation id)."""
        if (self.frozen and not force) or len(sequence) < _MIN_TOKENS or self.max_tokens <= 0:
            return
        with self._lock:
            tokens = self._new_part(np.asarray(sequence, np.int32), scope)[-self.max_tokens :]
            if len(tokens) < _MIN_TOKENS:
                return
            self.shelf(scope).add(tokens, self.serial, tag)
            self.bound()
            if self.path is not None:
                self.added.append(Added(scope, tokens, time.time_ns(), tag))
                self._bound_added()
            self.serial += 1

    def _new_part(self, sequence: np.ndarray, scope: str) -> np.ndarray:
        """``sequence`` less what an earlier sequence of the scope already holds of it (a chat's next turn, an
        agent resending its conversation: every turn's request starts with the last one), keeping ``_OVERLAP``
        tokens of it so that n-grams across the seam are indexed; the whole of it otherwise."""
        recent = self._fed.pop(scope, [])
        self._fed[scope] = recent  # the most recently fed scope last: the first to go is the longest unused
        while len(self._fed) > _FED_SCOPES:
            del self._fed[next(iter(self._fed))]
        best = max((old for old in recent if len(old.tokens) <= len(sequence)
                    and np.array_equal(sequence[: len(old.tokens)], old.tokens)),
                   key=lambda old: len(old.tokens), default=None)
        start = 0 if best is None else len(best.tokens)
        recent.append(_Fed(sequence, self.serial if best is None else best.since))
        del recent[:-_RECENT_FED]
        return sequence[max(0, start - _OVERLAP) :]

    def _bound_added(self) -> None:
        """What waits to be saved holds no more than the bound: older sequences would be dropped at the merge."""
        total = sum(len(a.tokens) for a in self.added)
        while total > self.max_tokens and len(self.added) > 1:
            total -= len(self.added.pop(0).tokens)

    def bound(self) -> None:
        """Drop the oldest sequences, over all scopes, until the tokens kept fit ``max_tokens``; past the bound it
        drops down to 90% of it, so that each sequence added does not shift every shelf's arrays again. The newest
        sequence always stays (a long one may fill most of the bound by itself)."""
        total = self.n_tokens
        if total <= self.max_tokens:
            return
        goal = total - int(self.max_tokens * 0.9)
        drop = {scope: 0 for scope in self.shelves}
        newest = max(int(s.serials[-1]) for s in self.shelves.values() if s.n_requests)
        while goal > 0:
            # the scope whose next sequence to drop is the oldest
            live = [(s.serials[drop[k]], k) for k, s in self.shelves.items()
                    if drop[k] < s.n_requests and s.serials[drop[k]] != newest]
            if not live:
                break
            _, scope = min(live)
            shelf, i = self.shelves[scope], drop[scope]
            end = int(shelf.starts[i + 1]) if i + 1 < shelf.n_requests else len(shelf.tokens)
            goal -= end - int(shelf.starts[i]) - 1
            drop[scope] = i + 1
        for scope, count in drop.items():
            self.shelves[scope].drop_oldest(count)
        for scope in [k for k, s in self.shelves.items() if not s.n_requests]:
            self._retire(scope)
            del self.shelves[scope]
        self._prune_fed()

    def _prune_fed(self) -> None:
        """Forget the recent sequences whose tokens were dropped: a conversation that comes back after its earlier
        part left the shelf is fed whole again, not as a seam onto nothing."""
        for scope in list(self._fed):
            shelf = self.shelves.get(scope)
            oldest = int(shelf.serials[0]) if shelf is not None and shelf.n_requests else None
            kept = [f for f in self._fed[scope] if oldest is not None and f.since >= oldest]
            if kept:
                self._fed[scope] = kept
            else:
                del self._fed[scope]

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.shelves.values())

    @property
    def n_requests(self) -> int:
        return sum(s.n_requests for s in self.shelves.values())

    @property
    def pending(self) -> int:
        """Tokens fed since the last save (what a crash would lose)."""
        return sum(len(a.tokens) for a in self.added)

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.shelves.values())

    def due(self) -> bool:
        """Whether a long-running process should save now (``SAVE_REQUESTS``, ``SAVE_SECONDS``)."""
        if self.path is None:
            return False
        if disk.cleared_at(self.path.parent) > self.synced:  # cleared meanwhile: stop drafting from what it removed
            return True
        if not self.added:
            return False
        return len(self.added) >= SAVE_REQUESTS or time.time_ns() - self.added[0].at >= SAVE_SECONDS * 1e9

    def save(self) -> bool:
        """Write what this process added (merged with what another wrote meanwhile, and without what a clear
        since removed); False, with a notice, if it could not. The work under the file's lock is one read, one
        merge per scope and one write, whatever was added."""
        path = self.path
        if path is None or (not self.added and disk.cleared_at(path.parent) <= self.synced):
            return False
        with self._lock:
            try:
                with disk.locked(path):
                    stamp = disk.stamp(path)
                    cleared = disk.cleared_at(path.parent)
                    if stamp != self.stamp or cleared > self.synced:
                        self._merge(path, stamp is not None, cleared)
                    if self.shelves:
                        disk.write(path, self.model, self.shelves, self.serial)
                    self.stamp = disk.stamp(path)
                    self.synced = time.time_ns()
                    self.added.clear()
                return True
            except OSError as e:
                self.notices.append(f"the history could not be saved to {path} ({_why(e)}): this run's requests "
                                    "are not kept")
                return False

    def _merge(self, path: Path, exists: bool, cleared: int) -> None:
        """The file's sequences (another process wrote, or a clear removed it), then ours on top: those fed after
        the last clear only, their serials going on from theirs (ours are the newest)."""
        ours = [a for a in self.added if a.at > cleared]
        self._adopt(*(self._read(path) if exists else ({}, 0)))
        by_scope: dict[str, list[Added]] = {}
        for a in ours:
            by_scope.setdefault(a.scope, []).append(a)
        serials = {id(a): self.serial + i for i, a in enumerate(ours)}
        for scope, items in by_scope.items():  # one merge per scope, not one per sequence
            self.shelf(scope).extend([a.tokens for a in items], [serials[id(a)] for a in items],
                                     [a.tag for a in items])
        self.serial += len(ours)
        self.added = ours
        self.bound()

    def forget(self, tag: int) -> None:
        """Drop every sequence tagged ``tag``, here and in the file (a deleted conversation's turns): what this
        process held and had not saved must not come back with its next save."""
        with self._lock:
            for scope, shelf in list(self.shelves.items()):
                if bool(np.any(shelf.tags == tag)):
                    self._retire(scope)
                    self.shelves[scope] = shelf.without(tag)
                    self.shelves[scope].epoch = max(self.shelves[scope].epoch, self._floor.get(scope, 0))
            self.shelves = {k: s for k, s in self.shelves.items() if s.n_requests}
            self.added = [a for a in self.added if a.tag != tag]
            self._fed.clear()
        if self.path is not None and self.path.exists():
            forget_in(self.path, tag)

    def clear(self) -> None:
        with self._lock:
            for scope in self.shelves:
                self._retire(scope)
            self.shelves.clear()
            self.added.clear()
            self._fed.clear()


def forget_in(path: Path, tag: int) -> bool:
    """Drop every sequence tagged ``tag`` from the history file at ``path`` (under its lock); False where it held
    none. A file that cannot be read is left for the next run to set aside."""
    with disk.locked(path):
        try:
            model = disk.model_of(path)
            shelves, serial = disk.read(path, model)
        except disk.Unreadable:
            return False
        if not any(bool(np.any(s.tags == tag)) for s in shelves.values()):
            return False
        kept = {scope: s.without(tag) for scope, s in shelves.items()}
        disk.write(path, model, {k: s for k, s in kept.items() if s.n_requests}, serial)
        return True


def forget_everywhere(tag: int) -> int:
    """Drop every sequence tagged ``tag`` from every kept history (``chat --delete``: no model is open); the number
    of files that held some."""
    folder = disk.history_dir()
    return sum(forget_in(path, tag) for path in sorted(folder.glob("*.npz"))) if folder.is_dir() else 0


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


@dataclass
class HistoryView:
    """What a lookup drafter sees: one scope of a history."""

    history: History
    scope: str = LOCAL_SCOPE
    tag: int = 0  # what what this view feeds is tagged with (a chat's conversation id)

    @property
    def shelf(self) -> Shelf:
        """The scope's shelf, or an empty one (never written to) while the scope has none."""
        return self.history.shelves.get(self.scope, _NONE)

    def lookup(
        self, tail: Sequence[int], cap: int, width: int = 1, hashes: Sequence[int] | None = None,
    ) -> Match | None:
        return self.shelf.lookup(tail, cap, width, hashes)

    def near(
        self, tail: Sequence[int], at: int, cap: int, epoch: int, *, hashes: Sequence[int] | None = None,
        longest: int = NS[-1],
    ) -> Match | None:
        return self.shelf.near(tail, at, cap, epoch, hashes=hashes, longest=longest)

    def continuation(self, at: int, cap: int, epoch: int) -> list[int]:
        return self.shelf.continuation(at, cap, epoch)

    @property
    def epoch(self) -> int:
        return self.shelf.epoch

    def feed(self, sequence: Sequence[int]) -> None:
        self.history.feed(sequence, self.scope, tag=self.tag)
