"""The vocabulary's pieces for llguidance, kept on disk per model (structured/pieces.py): the file gives back exactly
what llama.cpp gave, and a damaged or mismatched one is read anew, never used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.engine import Model
from localspec.schema.spec import ConstraintSpec
from localspec.structured import pieces as P
from localspec.structured.grammars import Grammars


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[Model]:
    with Model(model_path) as m:
        yield m


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    return tmp_path


def test_the_file_gives_back_what_llama_cpp_read(model: Model, home: Path) -> None:
    path = P.cache_path(model.path)
    assert not path.exists()
    first = P.pieces(model.vocab, model.path)
    assert path.is_file() and str(path).startswith(str(home))
    again = P.pieces(model.vocab, model.path)
    assert again == first
    assert len(first.pieces) == model.vocab.n_tokens and model.vocab.eos in first.eog
    # control tokens are marked, plain ones are their bytes
    assert first.pieces[model.vocab.eos].startswith(b"\xff")
    hello = model.vocab.tokenize("hello", add_special=False, parse_special=False)
    assert b"".join(first.pieces[t] for t in hello) == b"hello"


def test_a_damaged_or_mismatched_file_is_read_anew_and_written_again(model: Model, home: Path) -> None:
    path = P.cache_path(model.path)
    good = P.pieces(model.vocab, model.path)
    for damage in (b"", b"not a numpy file", path.read_bytes()[: path.stat().st_size // 2]):
        path.write_bytes(damage)
        assert P._read(path, model.vocab.n_tokens) is None
        assert P.pieces(model.vocab, model.path) == good
        assert P._read(path, model.vocab.n_tokens) == good  # written again
    assert P._read(path, model.vocab.n_tokens + 1) is None  # another vocabulary's size


def test_a_grammar_from_the_file_constrains_as_one_from_the_model(model: Model, home: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    spec = ConstraintSpec.json_schema(schema)
    fresh = Grammars(model.vocab, model=model.path)  # reads llama.cpp, writes the file
    cached = Grammars(model.vocab, model=model.path)  # reads the file
    assert fresh.matches(schema, {"n": 3}) and cached.matches(schema, {"n": 3})
    assert not cached.matches(schema, {"n": "three"})
    a, b = fresh.start(spec), cached.start(spec)
    assert a.matcher.compute_bitmask() == b.matcher.compute_bitmask()
    start = model.vocab.tokenize('{"n":', add_special=False, parse_special=False)
    assert a.matcher.consume_tokens(start) and b.matcher.consume_tokens(start)
    assert a.matcher.compute_bitmask() == b.matcher.compute_bitmask()
