"""Errors a user can act on.

Everything raised as a :class:`UserError` reaches the terminal as one line on stderr and exit code 2;
the message must say what is wrong and what to do about it.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line and exit code 2."""

    exit_code = 2


class ModelLoadError(UserError):
    """A model file that llama.cpp cannot load (missing, not GGUF, truncated, unsupported)."""


class ContextFullError(UserError):
    """The prompt (or the conversation) does not fit in the context window."""


class RollbackUnsupported(Exception):
    """The model's memory cannot drop a suffix of positions (recurrent/hybrid models)."""
