"""Tokenizer side of a model: text → token ids, token → bytes (cached); speculative/text.py assembles text."""

from __future__ import annotations

import ctypes

import llama_cpp


class Vocab:
    """Wraps a ``llama_vocab*``. Token pieces are cached: detokenising is a dict lookup per token."""

    def __init__(self, handle: llama_cpp.llama_vocab_p) -> None:
        self._handle = handle
        self.n_tokens: int = llama_cpp.llama_vocab_n_tokens(handle)
        self.bos: int = llama_cpp.llama_vocab_bos(handle)
        self.eos: int = llama_cpp.llama_vocab_eos(handle)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(handle))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._control: dict[int, bool] = {}
        self._buf = ctypes.create_string_buffer(256)

    @property
    def handle(self) -> llama_cpp.llama_vocab_p:
        """The ``llama_vocab*`` (llguidance's tokenizer reads it: structured/grammars.py)."""
        return self._handle

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._handle, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._handle, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        n = llama_cpp.llama_token_to_piece(self._handle, token, self._buf, len(self._buf), 0, False)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._handle, token, big, len(big), 0, False)
            data = big.raw[:n]
        else:
            data = self._buf.raw[:n]
        self._pieces[token] = data
        return data

    def is_eog(self, token: int) -> bool:
        cached = self._eog.get(token)
        if cached is None:
            cached = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._handle, token))
        return cached

    def is_control(self, token: int) -> bool:
        """A control token (``<|im_start|>``, ``<end_of_turn>``): text parses to it only with parse_special."""
        cached = self._control.get(token)
        if cached is None:
            cached = self._control[token] = bool(llama_cpp.llama_vocab_is_control(self._handle, token))
        return cached

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token (used to compare two vocabularies)."""
        raw = llama_cpp.llama_vocab_get_text(self._handle, token)
        return raw.decode("utf-8", "replace") if raw else ""
