"""`localspec pull` against a real HTTP hub on 127.0.0.1 serving real GGUF files, through real huggingface_hub."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.errors import UserError
from localspec.models import hub
from localspec.models.hub_cache import cached_path
from localspec.models.listing import choose_file, quant_of, shard_names
from localspec.models.records import PullResult, load_records
from tests.conftest import assert_one_line_error as one_line_error
from tests.conftest import interruptible
from tests.hub_server import HubFile, HubServer, make_gguf

REPO = "acme/Tiny-GGUF"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Everything under tmp_path: localspec's home and the hub cache (never ~)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    for var in ("HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


@pytest.fixture
def server(env: Path, monkeypatch: pytest.MonkeyPatch):
    with HubServer() as s:
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


def blobs(env: Path, repo: str = REPO) -> list[str]:
    folder = env / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def pull(repo: str, filename: str, **kw) -> PullResult:
    # token=False: in-process tests must not read a token file from ~.
    return hub.pull_file(repo, filename, token=kw.pop("token", False), progress=False, **kw)


def cli(env: Path, server: HubServer | None, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run the real command in a fresh process: huggingface_hub reads HF_* once, at import."""
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCALSPEC_"))}
    proc_env |= {
        "LOCALSPEC_HOME": str(env / "home"),
        "HF_HOME": str(env / "hf"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **({"HF_ENDPOINT": server.url} if server else {}),
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-c", "from localspec.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=proc_env,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    one_line_error(proc.returncode, proc.stderr, *needles)


# ---- downloads ------------------------------------------------------------------------------------------------


def test_pull_by_repo_and_file_lands_in_the_hub_cache(server: HubServer, env: Path) -> None:
    data = make_gguf(layers=3)
    server.add(REPO, {"tiny-Q4_K_M.gguf": data})

    result = pull(REPO, "tiny-Q4_K_M.gguf")

    assert result.downloaded and result.path.read_bytes() == data
    sha = hashlib.sha256(data).hexdigest()
    assert result.sha256 == sha
    # The standard layout: snapshots/<commit>/<file> -> blobs/<sha256>, so other hub tools share the file.
    assert result.path.parent.name == server.repos[REPO].commit
    assert result.path.resolve().name == sha
    assert blobs(env) == [sha]
    # huggingface_hub itself now finds it offline.
    assert cached_path(REPO, "tiny-Q4_K_M.gguf") == result.path
    assert [r["file"] for r in load_records()] == ["tiny-Q4_K_M.gguf"]

    gets = len(server.ranges("tiny-Q4_K_M.gguf"))
    again = pull(REPO, "tiny-Q4_K_M.gguf")
    assert not again.downloaded and again.path == result.path
    assert len(server.ranges("tiny-Q4_K_M.gguf")) == gets  # no second transfer


def test_resume_after_an_interrupted_transfer(server: HubServer, env: Path) -> None:
    data = make_gguf(tensor_elements=4096)
    server.add(REPO, {"m-Q8_0.gguf": data})
    sha = hashlib.sha256(data).hexdigest()
    # What an interrupted run leaves behind: the first bytes in the cache's .incomplete blob.
    partial = env / "hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / f"{sha}.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:5000])

    result = pull(REPO, "m-Q8_0.gguf")

    assert server.ranges("m-Q8_0.gguf") == ["bytes=5000-"]  # only the rest was asked for
    assert result.path.read_bytes() == data
    assert blobs(env) == [sha]  # the .incomplete became the blob


def test_checksum_mismatch_removes_the_file(server: HubServer, env: Path) -> None:
    data = make_gguf()
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF  # same length, one byte flipped: only the sha256 can tell
    server.add(REPO, {"m-Q4_K_M.gguf": HubFile(data, served=bytes(corrupt))})

    with pytest.raises(UserError, match="checksum mismatch for m-Q4_K_M.gguf.*removed"):
        pull(REPO, "m-Q4_K_M.gguf")

    assert blobs(env) == []  # neither a blob nor an .incomplete left
    assert cached_path(REPO, "m-Q4_K_M.gguf") is None
    assert load_records() == []


def test_sha256_from_models_toml_is_checked(server: HubServer, env: Path) -> None:
    server.add(REPO, {"m-Q4_K_M.gguf": make_gguf()})
    with pytest.raises(UserError, match="sha256 in models.toml is wrong"):
        pull(REPO, "m-Q4_K_M.gguf", sha256="0" * 64)
    assert blobs(env) == []


def test_a_file_that_is_not_gguf_is_removed(server: HubServer, env: Path) -> None:
    server.add(REPO, {"fake-Q4_K_M.gguf": b"<html>not a model</html>"})
    with pytest.raises(UserError, match="not a usable GGUF"):
        pull(REPO, "fake-Q4_K_M.gguf")
    assert blobs(env) == []


def test_disk_too_small_stops_before_downloading(server: HubServer, env: Path) -> None:
    server.add(REPO, {"huge-F16.gguf": HubFile(make_gguf(), declared_size=10**18)})
    with pytest.raises(UserError, match="not enough disk space for huge-F16.gguf: it needs 1000000.0 TB"):
        pull(REPO, "huge-F16.gguf")
    assert server.ranges("huge-F16.gguf") == []  # never asked for the bytes
    assert blobs(env) == []


# ---- listing and choosing ---------------------------------------------------------------------------------


def test_listing_groups_shards_and_picks_by_quant(server: HubServer) -> None:
    server.add(
        REPO,
        {
            "Tiny-Q4_K_M.gguf": make_gguf(seed=1),
            "Tiny-Q8_0.gguf": make_gguf(seed=2, tensor_elements=128),
            "mmproj-Tiny-F16.gguf": make_gguf(seed=3),
            "big/Tiny-F16-00001-of-00002.gguf": make_gguf(seed=4),
            "big/Tiny-F16-00002-of-00002.gguf": make_gguf(seed=5),
            "README.md": b"# tiny",
        },
    )
    files = hub.list_gguf_files(REPO, token=False)
    by_path = {f.path: f for f in files}
    assert set(by_path) == {
        "Tiny-Q4_K_M.gguf",
        "Tiny-Q8_0.gguf",
        "mmproj-Tiny-F16.gguf",
        "big/Tiny-F16-00001-of-00002.gguf",
    }
    assert by_path["big/Tiny-F16-00001-of-00002.gguf"].parts == 2
    assert by_path["Tiny-Q8_0.gguf"].quant == "Q8_0"

    assert choose_file(REPO, files, None, "Q4_K_M").path == "Tiny-Q4_K_M.gguf"
    assert choose_file(REPO, files, None, "q8_0").path == "Tiny-Q8_0.gguf"
    assert choose_file(REPO, files, "*Q8_0.gguf", "Q4_K_M").path == "Tiny-Q8_0.gguf"
    assert choose_file(REPO, files, None, "F16").parts == 2  # the mmproj F16 is never picked by quant
    with pytest.raises(UserError, match=r"has no Q2_K file; pick one with --quant .*Tiny-Q8_0.gguf \("):
        choose_file(REPO, files, None, "Q2_K")
    with pytest.raises(UserError, match=r"'\*.gguf' matches 4 files"):
        choose_file(REPO, files, "*.gguf", "Q4_K_M")
    with pytest.raises(UserError, match="no file in acme/Tiny-GGUF matches 'nope'"):
        choose_file(REPO, files, "nope", "Q4_K_M")


def test_quant_names_from_file_names() -> None:
    assert quant_of("Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-0.5b-instruct-q8_0.gguf") == "Q8_0"
    assert quant_of("gemma-3-12b-it-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("x/Model-BF16-00001-of-00003.gguf") == "BF16"
    assert quant_of("model.gguf") is None
    assert shard_names("d/M-Q4_K_M-00001-of-00002.gguf") == [
        "d/M-Q4_K_M-00001-of-00002.gguf",
        "d/M-Q4_K_M-00002-of-00002.gguf",
    ]


# ---- hub errors, one line each ----------------------------------------------------------------------------


def test_unknown_repo_missing_file_and_gated_repo(server: HubServer, env: Path) -> None:
    server.add(REPO, {"a-Q4_K_M.gguf": make_gguf()})
    server.add("acme/Gated-GGUF", {"g-Q4_K_M.gguf": make_gguf(seed=9)}, token="hf_secret")

    with pytest.raises(UserError, match="repository acme/Nope not found on http://127.0.0.1"):
        pull("acme/Nope", "a.gguf")
    with pytest.raises(UserError, match="acme/Tiny-GGUF has no file 'b.gguf'"):
        pull(REPO, "b.gguf")
    with pytest.raises(UserError, match="acme/Gated-GGUF is gated: accept its terms .* set HF_TOKEN"):
        pull("acme/Gated-GGUF", "g-Q4_K_M.gguf")
    with pytest.raises(UserError, match="is gated"):
        hub.list_gguf_files("acme/Gated-GGUF", token=False)
    assert pull("acme/Gated-GGUF", "g-Q4_K_M.gguf", token="hf_secret").downloaded


def test_network_unreachable(env: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match=f"cannot reach http://127.0.0.1:{port}"):
        pull(REPO, "a-Q4_K_M.gguf", endpoint=f"http://127.0.0.1:{port}")


# ---- the command, in a fresh process ------------------------------------------------------------------------


def write_user_registry(env: Path, server: HubServer) -> None:
    server.add("acme/Big-GGUF", {"Big-Q4_K_M.gguf": make_gguf(layers=4, seed=11)})
    server.add("acme/Small-GGUF", {"Small-Q8_0.gguf": make_gguf(layers=1, seed=12)})
    config = env / "home" / "config"
    config.mkdir(parents=True)
    (config / "models.toml").write_text(
        """
[models.big]
repo = "acme/Big-GGUF"
file = "Big-Q4_K_M.gguf"

[models.small]
repo = "acme/Small-GGUF"
file = "Small-Q8_0.gguf"

[profiles.pair]
target = "big"
drafter = "draft"
draft = "small"
k = 4
"""
    )


def test_cli_pull_profile_by_name_pulls_target_and_draft(server: HubServer, env: Path) -> None:
    write_user_registry(env, server)
    proc = cli(env, server, "pull", "pair", "--quiet")
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.strip().splitlines()
    assert [Path(p).name for p in paths] == ["Big-Q4_K_M.gguf", "Small-Q8_0.gguf"]
    assert all(Path(p).is_file() for p in paths)
    assert "big: downloaded and verified" in proc.stderr

    before = len(server.requests)
    again = cli(env, server, "pull", "big", "--quiet")
    assert again.returncode == 0 and "big: already downloaded" in again.stderr
    assert len(server.requests) - before == 1, server.requests[before:]  # docs/models.md: "costs one request"


def test_cli_pull_repo_lists_files_and_picks_quant(server: HubServer, env: Path) -> None:
    server.add(REPO, {"T-Q4_K_M.gguf": make_gguf(seed=1), "T-Q8_0.gguf": make_gguf(seed=2)})
    proc = cli(env, server, "pull", REPO, "--quant", "Q8_0", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).name == "T-Q8_0.gguf"
    assert "T-Q4_K_M.gguf" in proc.stderr and "* T-Q8_0.gguf" in proc.stderr  # the listing, choice marked

    missing = cli(env, server, "pull", REPO, "--quant", "Q2_K")
    assert_one_line_error(missing, "has no Q2_K file", "T-Q4_K_M.gguf")


def test_cli_errors_are_one_line_exit_2(server: HubServer, env: Path) -> None:
    server.add("acme/Gated-GGUF", {"g.gguf": make_gguf()}, token="hf_secret")
    assert_one_line_error(cli(env, server, "pull", "acme/Nope", "x.gguf"), "repository acme/Nope not found")
    assert_one_line_error(cli(env, server, "pull", "acme/Gated-GGUF", "g.gguf"), "is gated")
    ok = cli(env, server, "pull", "acme/Gated-GGUF", "g.gguf", "-q", HF_TOKEN="hf_secret")
    assert ok.returncode == 0, ok.stderr
    assert_one_line_error(cli(env, server, "pull", "no-such-name"), "unknown model 'no-such-name'")


def test_cli_offline_mode(server: HubServer, env: Path) -> None:
    server.add(REPO, {"T-Q4_K_M.gguf": make_gguf()})
    offline = cli(env, server, "pull", REPO, "T-Q4_K_M.gguf", HF_HUB_OFFLINE="1")
    assert_one_line_error(offline, "not in the local cache and HF_HUB_OFFLINE is set")
    assert cli(env, server, "pull", REPO, "T-Q4_K_M.gguf", "-q").returncode == 0
    requests = len(server.requests)
    cached = cli(env, server, "pull", REPO, "T-Q4_K_M.gguf", "-q", HF_HUB_OFFLINE="1")
    assert cached.returncode == 0, cached.stderr
    assert len(server.requests) == requests  # offline means no requests at all


def test_ctrl_c_keeps_a_resumable_partial_file(server: HubServer, env: Path) -> None:
    # Large enough that huggingface_hub writes a first 10 MB chunk before the server stalls.
    data = make_gguf(tensor_elements=3_500_000, layers=2)  # ~28 MB
    server.add(REPO, {"T-Q4_K_M.gguf": HubFile(data, stall_after=12_000_000)})
    sha = hashlib.sha256(data).hexdigest()
    partial = env / "hf" / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / f"{sha}.incomplete"

    proc_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCALSPEC_"))}
    proc_env |= {"LOCALSPEC_HOME": str(env / "home"), "HF_HOME": str(env / "hf"), "HF_ENDPOINT": server.url,
                 "HF_HUB_DISABLE_XET": "1"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", "from localspec.cli import main; main()", "pull", REPO, "T-Q4_K_M.gguf", "-q"],
        env=proc_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
    while not (partial.exists() and partial.stat().st_size >= 10 * 2**20) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)

    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    kept = partial.stat().st_size
    assert kept >= 10 * 2**20
    assert not (partial.parent / sha).exists()  # nothing that looks complete

    server.repos[REPO].files["T-Q4_K_M.gguf"].stall_after = None
    again = cli(env, server, "pull", REPO, "T-Q4_K_M.gguf", "-q")
    assert again.returncode == 0, again.stderr
    assert server.ranges("T-Q4_K_M.gguf")[-1] == f"bytes={kept}-"
    assert Path(again.stdout.strip()).read_bytes() == data
