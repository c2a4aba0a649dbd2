"""Errors a user can act on.

Everything raised as a :class:`UserError` reaches the terminal as one line on stderr and exit code 2;
the message must say what is wrong and what to do about it.
"""

from __future__ import annotations

# what a guard around one request's work lets through: the process is stopping, not the request failing. Anything
# else, llguidance's Rust panics included (pyo3's PanicException is a BaseException), is that request's failure
STOPPING = (KeyboardInterrupt, SystemExit, GeneratorExit)


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line and exit code 2."""

    exit_code = 2


class ModelLoadError(UserError):
    """A model file that llama.cpp cannot load (missing, not GGUF, truncated, unsupported)."""


class ContextFullError(UserError):
    """The prompt (or the conversation) does not fit in the context window."""

    @classmethod
    def prompt(cls, tokens: int, n_ctx: int) -> ContextFullError:
        return cls(f"the prompt is {tokens} tokens but the context holds {n_ctx}: raise --ctx or shorten the prompt")


class RollbackUnsupported(Exception):
    """The model's memory cannot drop a suffix of positions (recurrent/hybrid models)."""
