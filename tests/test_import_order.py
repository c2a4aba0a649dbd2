"""No entry point imports numpy before llama.cpp's shared libraries are loaded (README 'GPU').

On a CUDA build that order segfaults the first model load; this CPU build does not crash, so the tests check the
order itself: each entry point runs in a fresh interpreter under a probe that, the moment numpy is first
imported, reads /proc/self/maps and fails the run unless libllama is already mapped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec._native import _GPU_BACKENDS

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# the `localspec` script pip installs beside this Python; absent where localspec runs from PYTHONPATH (the GPU recipe)
SCRIPT = VENV_BIN / "localspec"
NO_SCRIPT = f"no installed `localspec` script beside this Python ({SCRIPT}): localspec runs from PYTHONPATH here"
VIOLATION = 97

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps (Linux)")

# argv: "module NAME ARGS…" (python -m), "path FILE ARGS…" (a script), "import NAME" (used as a library)
PROBE = rf"""
import importlib, os, runpy, sys

class NumpyProbe:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            with open("/proc/self/maps") as maps:
                if "/libllama." not in maps.read():
                    import traceback
                    print("numpy imported before llama.cpp's libraries were loaded:", file=sys.stderr)
                    traceback.print_stack(file=sys.stderr)
                    sys.stderr.flush()
                    os._exit({VIOLATION})
        return None

sys.meta_path.insert(0, NumpyProbe())
how, what, *args = sys.argv[1:]
sys.argv = [what, *args]
if how == "module":
    runpy.run_module(what, run_name="__main__", alter_sys=True)
elif how == "path":
    sys.path[0] = os.path.dirname(os.path.abspath(what))
    runpy.run_path(what, run_name="__main__")
else:
    importlib.import_module(what)
    assert "numpy" in sys.modules or what in {{"localspec", "localspec.cli"}}, "the probe saw no numpy import"
"""


def _probe(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # this checkout first, even where .venv's editable install is another; a PYTHONPATH already set still holds
    # llama_cpp where it is not installed (the GPU recipe's separate CUDA build)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


def _assert_order(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode != VIOLATION, proc.stderr[-3000:]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"


LIBRARY_MODULES = [
    "localspec.engine.model", "localspec.tui.app", "localspec.bench.runner", "localspec.speculative.loop",
    "localspec.sampling", "localspec.speculative.policy", "localspec.runtime", "localspec.bench.report",
    "localspec.serve.app", "localspec.serve.service",
]  # fmt: skip


@pytest.mark.parametrize("module", LIBRARY_MODULES)
def test_importing_localspec_as_a_library_loads_llama_cpp_before_numpy(module):
    _assert_order(_probe("import", module))


@pytest.mark.parametrize(
    "argv",
    [
        ("module", "localspec", "--help"),
        ("module", "localspec", "bench", "--help"),
        ("path", str(SCRIPT), "--help"),
        ("path", "tools/chat_vs_run.py", "--help"),
        ("path", "tools/lookup_oracle.py", "--help"),
        ("path", "tools/decode_ceiling.py", "--help"),
        ("path", "tools/gpu_replay.py", "--help"),
    ],
    ids=lambda argv: " ".join(Path(a).name if "/" in a else a for a in argv),
)
def test_entry_points_load_llama_cpp_before_numpy(argv):
    if argv[0] == "path" and not Path(ROOT, argv[1]).exists():
        pytest.skip(NO_SCRIPT if argv[1] == str(SCRIPT) else f"{argv[1]} is not there")
    _assert_order(_probe(*argv))


@pytest.mark.skipif(not SCRIPT.exists(), reason=NO_SCRIPT)
def test_a_command_that_loads_the_model_loads_llama_cpp_before_numpy(model_path):
    proc = _probe("path", str(SCRIPT), "run", "hi", "--max-tokens", "1", "--drafter", "none")
    _assert_order(proc)


def test_the_test_suite_loads_llama_cpp_before_numpy():
    # tests/toy.py and several test modules import numpy at their top: conftest.py must have loaded llama.cpp
    proc = _probe("module", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                  "tests/test_loop_toy.py", "tests/test_verify.py")
    _assert_order(proc)


def test_help_loads_neither_llama_cpp_nor_numpy():
    # What keeps `localspec --help` fast: only llama.cpp's libraries are loaded, not the llama_cpp package.
    code = (
        "import runpy, sys\n"
        "sys.argv = ['localspec', '--help']\n"
        "try:\n    runpy.run_module('localspec', run_name='__main__', alter_sys=True)\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules))\n"
    )
    # this checkout first, and a PYTHONPATH already set kept: it holds the dependencies where localspec runs from
    # PYTHONPATH (the GPU recipe)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_numpy_imported_first_on_a_gpu_build_warns(tmp_path):
    # A fake llama_cpp package whose lib/ holds this build's libllama plus a GPU backend's file name: the
    # warning is decided from the files, before anything of the GPU backend is loaded.
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations
    libllama = Path(next(iter(spec.submodule_search_locations)), "lib", "libllama.so")
    if not libllama.exists():
        pytest.skip(f"no {libllama}")
    lib = tmp_path / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "llama_cpp" / "__init__.py").write_text("")
    # a CPU build's files only: on a CUDA build the real folder already holds libggml-cuda.so, and the fake would
    # warn before the test adds one (it failed so on an H200, 2026-11-26)
    gpu_files = tuple(f"lib{b}." for b in _GPU_BACKENDS)
    for so in libllama.parent.iterdir():
        if not so.name.startswith(gpu_files):
            (lib / so.name).symlink_to(so)
    code = (
        "import warnings, numpy\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import localspec\n"
        "print(sum(issubclass(w.category, RuntimeWarning) and 'before numpy' in str(w.message) for w in caught))\n"
    )

    def warnings_seen() -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert warnings_seen() == "0"  # a CPU build: nothing to warn about
    (lib / "libggml-cuda.so").write_bytes(b"")
    assert warnings_seen() == "1"
