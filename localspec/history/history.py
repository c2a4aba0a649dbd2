"""A model's history: a shelf per scope, bounded over all of them (the oldest sequence out first), fed when a
generation ends, and kept on disk where the face keeps it (disk.py).

Scopes: ``LOCAL_SCOPE`` for the user's own work (run, chat, batch, the Python API); ``key:<hash>`` for a server's
API key (the key itself is never stored, only a short hash of it); ``server`` for a server without keys.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localspec.history import disk
from localspec.history.store import DEFAULT_MAX_TOKENS, NS, Match, Shelf

LOCAL_SCOPE = "local"
SERVER_SCOPE = "server"
_MIN_TOKENS = 8  # a sequence shorter than this teaches nothing worth keeping
_RECENT_FED = 8  # per scope, the last sequences fed: a conversation that comes back adds only its new part
_OVERLAP = 16  # tokens of the old part kept before the new one (the longest n-gram indexed)
_NONE = Shelf()  # what a view of a scope without a shelf reads: nothing


def scope_of_key(api_key: str | None) -> str:
    """The scope of a server's requests: one per API key (a hash: the file must not hold the key)."""
    if api_key is None:
        return SERVER_SCOPE
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


@dataclass
class History:
    """Every scope's shelf for one model. ``path``: where it is kept (None: in memory only). ``model``: the model
    file's sha256 (a file of another model is set aside, never used)."""

    model: str
    path: Path | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    shelves: dict[str, Shelf] = field(default_factory=dict)
    serial: int = 0  # the next sequence's serial: order of arrival over all scopes
    # what this process added since it loaded (merged into the file's newer content when saving: disk.py)
    added: list[tuple[str, list[int], int]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    # a bench feeds by hand (each prompt after all its runs): the hooks then do nothing
    frozen: bool = False
    stamp: tuple[int, int, int, str] | None = None  # the file as this process last read or wrote it (disk.py)
    _fed: dict[str, list[list[int]]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, model: str, path: Path | None, max_tokens: int = DEFAULT_MAX_TOKENS) -> History:
        """The history kept at ``path`` (empty if there is none, or if it was set aside: see ``notices``)."""
        history = cls(model, path, max_tokens)
        if path is not None and path.exists():
            with disk.locked(path):  # the stamp of the very write read (a save compares it)
                history.stamp = disk.stamp(path)
                history.shelves, history.serial = history._read(path)
            history.bound()
        return history

    def _read(self, path: Path) -> tuple[dict[str, Shelf], int]:
        """The file's shelves and next serial; nothing (and the file set aside, with a notice) if unusable."""
        try:
            return disk.read(path, self.model)
        except disk.Unreadable as e:
            self.notices.append(disk.set_aside(path, str(e)))
            return {}, 0

    def view(self, scope: str = LOCAL_SCOPE) -> HistoryView:
        return HistoryView(self, scope)

    def shelf(self, scope: str) -> Shelf:
        shelf = self.shelves.get(scope)
        if shelf is None:
            shelf = self.shelves[scope] = Shelf()
        return shelf

    def feed(self, sequence: Sequence[int], scope: str = LOCAL_SCOPE, *, force: bool = False) -> None:
        """Keep ``sequence`` (a prompt and what was generated after it) for later lookups in ``scope``."""
        if (self.frozen and not force) or len(sequence) < _MIN_TOKENS or self.max_tokens <= 0:
            return
        with self._lock:
            tokens = self._new_part(list(sequence), scope)[-self.max_tokens :]
            if len(tokens) < _MIN_TOKENS:
                return
            self._add(scope, tokens, self.serial)
            if self.path is not None:
                self.added.append((scope, tokens, self.serial))
            self.serial += 1

    def _new_part(self, sequence: list[int], scope: str) -> list[int]:
        """``sequence`` less what an earlier sequence of the scope already holds of it (a chat's next turn, an
        agent resending its conversation: every turn's request starts with the last one), keeping ``_OVERLAP``
        tokens of it so that n-grams across the seam are indexed; the whole of it otherwise."""
        recent = self._fed.setdefault(scope, [])
        start = max((len(old) for old in recent if len(old) <= len(sequence) and sequence[: len(old)] == old),
                    default=0)
        recent.append(sequence)
        del recent[:-_RECENT_FED]
        return sequence[max(0, start - _OVERLAP) :]

    def _add(self, scope: str, tokens: list[int], serial: int) -> None:
        self.shelf(scope).add(tokens, serial)
        self.bound()

    def bound(self) -> None:
        """Drop the oldest sequences, over all scopes, until the tokens kept fit ``max_tokens``; past the bound it
        drops down to 90% of it, so that each sequence added does not shift every shelf's arrays again."""
        total = self.n_tokens
        if total <= self.max_tokens:
            return
        goal = total - int(self.max_tokens * 0.9)
        drop = {scope: 0 for scope in self.shelves}
        while goal > 0:
            # the scope whose next sequence to drop is the oldest
            live = [(s.serials[drop[k]], k) for k, s in self.shelves.items() if drop[k] < s.n_requests]
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
            del self.shelves[scope]

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.shelves.values())

    @property
    def n_requests(self) -> int:
        return sum(s.n_requests for s in self.shelves.values())

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.shelves.values())

    def save(self) -> bool:
        """Write what this process added (merged with what another wrote meanwhile); False if it could not."""
        path = self.path
        if path is None or not self.added:
            return False
        with self._lock:
            try:
                with disk.locked(path):
                    stamp = disk.stamp(path)
                    if stamp is not None and stamp != self.stamp:
                        # theirs, then ours on top: the serials go on from theirs (ours are the newest)
                        self.shelves, self.serial = self._read(path)
                        for scope, tokens, _ in self.added:
                            self.shelf(scope).add(tokens, self.serial)
                            self.serial += 1
                        self.bound()
                    disk.write(path, self.model, self.shelves, self.serial)
                    self.stamp = disk.stamp(path)
                    self.added.clear()
                return True
            except OSError as e:
                self.notices.append(f"the history could not be saved to {path}: {e}")
                return False

    def clear(self) -> None:
        with self._lock:
            self.shelves.clear()
            self.added.clear()


@dataclass
class HistoryView:
    """What a lookup drafter sees: one scope of a history."""

    history: History
    scope: str = LOCAL_SCOPE

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
        self.history.feed(sequence, self.scope)
