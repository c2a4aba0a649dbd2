"""Drafts from what was written before: earlier requests' tokens, per model and scope (store.py), kept on disk
(disk.py) by the runtime that opens it (history.py)."""

from localspec.history.history import LOCAL_SCOPE, History, HistoryView, scope_of_key

__all__ = ["LOCAL_SCOPE", "History", "HistoryView", "scope_of_key"]
