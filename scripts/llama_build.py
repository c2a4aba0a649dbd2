"""How to build llama-cpp-python for this machine, and whether the installed build works.

Stdlib only, no side effects on import: ``scripts/setup`` runs it, ``tests/test_llama_build.py`` imports it.

    python scripts/llama_build.py cmake-args        print the CMAKE_ARGS to build with (a note on stderr)
    python scripts/llama_build.py describe          one line: what kind of build that is, and why
    python scripts/llama_build.py pip-cmake-args    the CMAKE_ARGS pip's build gets: those, kept to the library
    python scripts/llama_build.py tools rpc,anchors the CMake targets of the extra binaries those setup flags ask for
    python scripts/llama_build.py tool-cmake-args   the -D flags that add llama.cpp's tools to llama-cpp-python's tree
    python scripts/llama_build.py tree-ok DIR SRC ARGS  exit 0 if DIR is a build tree of SRC made with ARGS
    python scripts/llama_build.py installed         exit 0 if llama_cpp imports and is new enough
    python scripts/llama_build.py check MODEL.gguf  load MODEL and decode in a subprocess: ok or crashed
        [--expect-gpu]                              ... with every layer on the GPU, else exit 3

Why this exists: a default ``pip install llama-cpp-python`` builds llama.cpp with ``GGML_NATIVE=ON``, which
turns on the CPU's AMX instructions where the compiler sees them, and the first ``llama_decode`` can then
segfault in ``ggml_backend_amx_mul_mat``. On x86-64 Linux we keep the native build and switch AMX off with
``-mno-amx-*`` compiler flags (GCC and Clang keep an explicit ``-mno-*`` over ``-march=native``). And since
pip's wheel cache ignores CMAKE_ARGS, a wheel built earlier with other flags can be reused silently: hence
``check``, which proves the installed library can decode, in a subprocess so that a crash is reported rather
than suffered.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# Exit codes of `check`. setup rebuilds on CRASHED, BROKEN and NO_GPU (a model problem is not the build's).
OK, CRASHED, BROKEN, NO_GPU, MODEL_PROBLEM = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class PlatformInfo:
    """The facts about a machine that decide how llama.cpp should be built on it."""

    system: str  # platform.system(): "Linux", "Darwin", "Windows", ...
    machine: str  # platform.machine(): "x86_64", "AMD64", "arm64", "aarch64", ...
    has_nvcc: bool = False  # a CUDA compiler is installed
    has_nvidia_gpu: bool = False  # an NVIDIA driver and device are present (nvcc alone is not enough to run)
    compiler_knows_amx: bool = True  # the C compiler accepts -mno-amx-tile (if not, it cannot emit AMX)
    cpu_has_amx: bool = False  # informational: the CPU advertises amx_tile
    user_cmake_args: str | None = None  # CMAKE_ARGS from the environment: wins over everything

    @property
    def arch(self) -> str:
        m = self.machine.lower()
        if m in ("x86_64", "amd64", "x64"):
            return "x86_64"
        if m in ("arm64", "aarch64", "armv8", "armv8l"):
            return "arm64"
        return m


# localspec never loads the multimodal library (tools/mtmd: clip, llava): not building it shortens the first setup,
# and `import llama_cpp` does not need it (only llama_chat_format's image handlers import it, lazily)
NO_MTMD = "-DLLAVA_BUILD=OFF"
# The RPC backend is in every build: it is one small source file, and the test suite needs it. A build without it
# made `scripts/run` then `scripts/test` (which needs it) build llama-cpp-python twice: 6 minutes on 2 cores.
RPC = "-DGGML_RPC=on"

# The binaries built beside the library, by the setup flag that asks for them. They are built once, on first need,
# in the CMake tree pip built llama-cpp-python in (same sources, same flags), so they compile only their own files.
TOOLS = {"rpc": ("ggml-rpc-server",), "anchors": ("llama-server", "llama-bench")}
# What adds them to that tree: llama-cpp-python configures llama.cpp as a subproject, with its tools off. The web UI
# is neither built (npm) nor downloaded (a prebuilt copy from a Hugging Face bucket): the load test needs the API.
# LLAVA_BUILD off: llama.cpp's tools add tools/mtmd themselves, and a second add_subdirectory of it is an error.
TOOL_CMAKE_ARGS = (
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
)
# scripts/setup writes the CMAKE_ARGS a tree was configured with into it: a tree made with other flags is not reused
ARGS_RECORD = ".localspec-cmake-args"


def choose_cmake_args(info: PlatformInfo) -> str:
    """The CMAKE_ARGS to build llama-cpp-python with on ``info``'s machine.

    The user's own CMAKE_ARGS are used as given, plus the RPC backend unless they say GGML_RPC themselves."""
    if info.user_cmake_args is not None and info.user_cmake_args.strip():
        user = info.user_cmake_args.strip()
        return user if "GGML_RPC" in user else f"{user} {RPC}"
    return " ".join([*_platform_args(info), NO_MTMD, RPC])


# CMake includes it right after llama.cpp's project(): it switches llama.cpp's common library off for the library build
NO_COMMON = Path(__file__).resolve().with_name("llama_no_common.cmake")


def pip_cmake_args(info: PlatformInfo, no_common: Path = NO_COMMON) -> str:
    """The CMAKE_ARGS pip's build of llama-cpp-python gets: ``choose_cmake_args`` (what setup records and compares),
    plus what keeps that build to the library in a tree the tools step may have changed:
    - llama.cpp's tools off (pip builds "all", and the tools' install rules need every tool built);
    - LLAVA_BUILD back to the flags' value (the tools step turns llama-cpp-python's own mtmd off);
    - with the flags chosen here, llama.cpp's common library off (``no_common``): llama-cpp-python forces it on, ships
      none of it, and it was half of the first build (common 670 and cpp-httplib 83 of 1568 compile-seconds on
      2 cores). With the user's own flags it stays, as llama-cpp-python builds it."""
    args = [choose_cmake_args(info), "-DLLAMA_BUILD_TOOLS=OFF"]
    if "LLAVA_BUILD" not in args[0]:
        args.append("-DLLAVA_BUILD=ON")
    if info.user_cmake_args is None or not info.user_cmake_args.strip():
        args.append(shlex.quote(f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={no_common}"))
    return " ".join(args)


def tool_targets(flags: str) -> list[str]:
    """The CMake targets of the extra binaries that setup's ``flags`` (comma-separated: rpc, anchors) ask for."""
    wanted = [f for f in flags.split(",") if f]
    unknown = [f for f in wanted if f not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool group(s) {', '.join(unknown)}: known are {', '.join(TOOLS)}")
    return [target for f in wanted for target in TOOLS[f]]


def tree_reusable(build_dir: Path, source_dir: Path, cmake_args: str) -> tuple[bool, str]:
    """Whether ``build_dir`` is a CMake tree configured from ``source_dir`` with ``cmake_args``, so that building
    a tool there compiles only the tool. A tree from other sources or flags must go: CMake keeps cached values that
    the new flags do not mention (a GGML_CUDA=on would outlive its removal)."""
    cache = build_dir / "CMakeCache.txt"
    if not cache.is_file():
        return False, "no build tree"
    home = next(
        (
            line.partition("=")[2]
            for line in cache.read_text(errors="replace").splitlines()
            if line.startswith("CMAKE_HOME_DIRECTORY:")
        ),
        "",
    )
    if not home or Path(home).resolve() != source_dir.resolve() or not (source_dir / "CMakeLists.txt").is_file():
        return False, f"the tree was configured from {home or 'unknown sources'}, not {source_dir}"
    record = build_dir / ARGS_RECORD
    recorded = record.read_text().strip() if record.is_file() else None
    if recorded != cmake_args.strip():
        return False, f"the tree was built with other CMAKE_ARGS ({recorded if recorded is not None else 'unknown'})"
    return True, "reusable"


def _platform_args(info: PlatformInfo) -> list[str]:
    args = []
    if info.system == "Darwin" and info.arch == "arm64":
        return ["-DGGML_METAL=on"]  # Apple Silicon: Metal (llama.cpp's default there, stated explicitly)
    if info.system == "Linux" and info.has_nvcc and info.has_nvidia_gpu:
        # "native": the GPUs of this machine (found by nvcc at build time), which keeps the build to one
        # architecture: minutes instead of the half hour of CUDA's default list.
        args.append("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native")
    if info.system == "Linux" and info.arch == "x86_64" and info.compiler_knows_amx:
        args.append(f'-DCMAKE_C_FLAGS="{AMX_OFF}" -DCMAKE_CXX_FLAGS="{AMX_OFF}"')
    return args


def describe(info: PlatformInfo) -> str:
    """One line for humans: the kind of build chosen and why."""
    if info.user_cmake_args is not None and info.user_cmake_args.strip():
        return f"your CMAKE_ARGS ({info.user_cmake_args.strip()}), used as given"
    args = choose_cmake_args(info)
    kind = "CUDA" if "GGML_CUDA=on" in args else "Metal" if "GGML_METAL=on" in args else "CPU"
    notes = []
    if AMX_OFF in args:
        notes.append("AMX off" + (" (this CPU has AMX)" if info.cpu_has_amx else ""))
    if info.system == "Linux" and info.has_nvcc and not info.has_nvidia_gpu:
        notes.append("nvcc found but no NVIDIA GPU/driver, so no CUDA (CMAKE_ARGS=-DGGML_CUDA=on forces it)")
    return kind + (f", {'; '.join(notes)}" if notes else "")


# --- detection on the real machine --------------------------------------------------------------------------


def _find_nvcc() -> bool:
    if shutil.which("nvcc"):
        return True
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return any(r and Path(r, "bin", "nvcc").is_file() for r in roots)


def _find_nvidia_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    if Path("/dev/nvidia0").exists() or (gpus.is_dir() and any(gpus.iterdir())):
        return True
    smi = shutil.which("nvidia-smi") or ("/usr/lib/wsl/lib/nvidia-smi" if Path("/dev/dxg").exists() else None)
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _compiler_knows_amx() -> bool:
    """Whether the C compiler CMake will use accepts -mno-amx-tile (GCC >= 11, Clang >= 11 do)."""
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if not cc:
        return True  # no compiler to ask: pass the flags; a compiler without AMX support would say so loudly
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "t.c")
        src.write_text("int main(void) { return 0; }\n")
        try:
            out = subprocess.run(
                [*cc.split(), *AMX_OFF.split(), "-c", str(src), "-o", str(Path(tmp, "t.o"))],
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return True
    return out.returncode == 0


def _cpu_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def detect() -> PlatformInfo:
    """The real machine's PlatformInfo (runs `cc` and maybe `nvidia-smi`: a fraction of a second)."""
    system, machine = platform.system(), platform.machine()
    linux_x86 = system == "Linux" and machine.lower() in ("x86_64", "amd64")
    return PlatformInfo(
        system=system,
        machine=machine,
        has_nvcc=system == "Linux" and _find_nvcc(),
        has_nvidia_gpu=system == "Linux" and _find_nvidia_gpu(),
        compiler_knows_amx=_compiler_knows_amx() if linux_x86 else False,
        cpu_has_amx=linux_x86 and _cpu_has_amx(),
        user_cmake_args=os.environ.get("CMAKE_ARGS"),
    )


# --- is the installed build usable? -------------------------------------------------------------------------

# Runs in a child process: load the model, decode one token, then a batch of 4 (the shape a speculative
# verification pass has), and check the logits are finite. Prints "ok", whether there is a GPU to offload to and
# how many layers llama.cpp says it offloaded (from its load log, which still goes to stderr). With "gpu" as
# second argument, every layer is asked for on the GPU.
_CHILD = r"""
import ctypes, math, os, re, sys
import llama_cpp as L

path, want_gpu = sys.argv[1], sys.argv[2:] == ["gpu"]
offloaded = ["none"]

@L.llama_log_callback
def log(level, text, user_data):
    text = (text or b"").decode("utf-8", "replace")
    found = re.search(r"offloaded (\d+/\d+) layers to GPU", text)
    if found:
        offloaded[0] = found.group(1)
    sys.stderr.write(text)

L.llama_log_set(log, ctypes.c_void_p(0))
L.llama_backend_init()
mp = L.llama_model_default_params()
if want_gpu:
    mp.n_gpu_layers = -1  # all of them
model = L.llama_model_load_from_file(path.encode(), mp)
if not model:
    print("model-load-failed"); sys.exit(4)
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, 8, 8
cp.n_threads = cp.n_threads_batch = max(1, min(os.cpu_count() or 1, 8))
ctx = L.llama_init_from_model(model, cp)
if not ctx:
    print("context-failed"); sys.exit(2)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
bos = L.llama_vocab_bos(vocab)
batch = L.llama_batch_init(8, 0, 1)
for start, n in ((0, 1), (1, 4)):
    print(f"decoding {n} token(s) at position {start}", file=sys.stderr, flush=True)
    batch.n_tokens = n
    for i in range(n):
        batch.token[i] = bos if start + i == 0 else (1000 + 7 * (start + i)) % n_vocab
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        print(f"decode-failed rc={rc}"); sys.exit(2)
    row = L.llama_get_logits_ith(ctx, n - 1)
    if not all(math.isfinite(row[j]) for j in range(0, n_vocab, 997)):
        print("non-finite-logits"); sys.exit(2)
L.llama_batch_free(batch)
L.llama_free(ctx)
L.llama_model_free(model)

# llama_supports_gpu_offload says yes for any RPC build (every build of ours), GPU or not: count the GPU devices
# ggml registered instead (enum ggml_backend_dev_type: 1 GPU, 2 IGPU), through libggml beside libllama.
def gpu_devices():
    from pathlib import Path
    lib_dir = Path(L.__file__).parent / "lib"
    names = [p for n in ("libggml.so", "libggml.dylib", "ggml.dll") for p in [lib_dir / n] if p.exists()]
    if not names:
        return int(bool(L.llama_supports_gpu_offload()))
    g = ctypes.CDLL(str(names[0]))
    g.ggml_backend_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    devices = (g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count()))
    return sum(g.ggml_backend_dev_type(d) in (1, 2) for d in devices)

print("ok gpu_offload=%d offloaded=%s" % (int(gpu_devices() > 0), offloaded[0]))
"""


@dataclass(frozen=True)
class CheckResult:
    code: int  # OK, CRASHED, BROKEN, NO_GPU or MODEL_PROBLEM
    message: str


def check(model: Path, python: str = sys.executable, expect_gpu: bool = False, timeout: float = 300.0) -> CheckResult:
    """Load ``model`` and decode with the llama_cpp that ``python`` imports, in a subprocess.

    ``expect_gpu``: every layer is put on the GPU, and anything less (no GPU offload compiled in, or llama.cpp
    offloading only some layers) is NO_GPU."""
    if not model.is_file():
        return CheckResult(MODEL_PROBLEM, f"model file not found: {model}")
    try:
        proc = subprocess.run(
            [python, "-c", _CHILD, str(model), *(["gpu"] if expect_gpu else [])],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return CheckResult(BROKEN, f"the smoke decode did not finish within {timeout:.0f} s")
    tail = "\n".join((proc.stderr or "").strip().splitlines()[-8:])
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return CheckResult(CRASHED, _crash_explanation(name) + (f"\nlast output:\n{tail}" if tail else ""))
    out = proc.stdout.strip().splitlines()
    last = out[-1] if out else ""
    if proc.returncode == MODEL_PROBLEM:
        return CheckResult(MODEL_PROBLEM, f"llama.cpp could not load {model}\n{tail}")
    if proc.returncode != 0 or not last.startswith("ok"):
        why = f"{last or 'no output'}, exit {proc.returncode}"
        return CheckResult(BROKEN, f"llama_cpp is installed but not working ({why})\n{tail}")
    facts = dict(item.partition("=")[::2] for item in last.split()[1:])
    if expect_gpu and facts.get("gpu_offload") != "1":
        return CheckResult(
            NO_GPU,
            "llama_cpp works but has no GPU offload here (a CPU build, a wheel from pip's cache, or no GPU device)",
        )
    done, _, total = facts.get("offloaded", "none").partition("/")
    if expect_gpu and not (done.isdigit() and done == total):
        return CheckResult(
            NO_GPU, f"llama_cpp has GPU offload, but llama.cpp offloaded {facts.get('offloaded')} layers, not all"
        )
    where = f"all {total} layers on the GPU" if expect_gpu else f"gpu_offload={facts.get('gpu_offload', '?')}"
    return CheckResult(OK, f"ok: loaded {model.name} and decoded 1 + 4 tokens ({where})")


def _crash_explanation(signame: str) -> str:
    if signame == "SIGSEGV":
        return (
            "crashed: SIGSEGV during the smoke decode. The usual cause is llama.cpp's AMX matmul path "
            "(ggml_backend_amx_mul_mat) in a build made with the CPU's AMX instructions on, e.g. a default "
            "`pip install llama-cpp-python`, or a wheel reused from pip's cache that was built with other "
            "CMAKE_ARGS. Fix: rebuild with AMX off (scripts/setup does: --no-cache-dir --force-reinstall)."
        )
    if signame == "SIGILL":
        return (
            "crashed: SIGILL (illegal instruction) during the smoke decode: this llama.cpp was compiled for "
            "another CPU (-march=native on a different machine, reused from pip's cache). Fix: rebuild here "
            "with --no-cache-dir --force-reinstall (scripts/setup does this)."
        )
    return f"crashed: {signame} during the smoke decode; rebuilding llama-cpp-python may help."


def installed(python: str = sys.executable) -> tuple[bool, str]:
    """Whether llama_cpp imports under ``python`` with version >= LLAMA_CPP_VERSION (no model needed)."""
    code = "import llama_cpp; print(llama_cpp.__version__)"
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        return False, f"llama_cpp does not import: {lines[-1] if lines else f'exit {proc.returncode}'}"
    version = proc.stdout.strip()
    if _version_tuple(version) < _version_tuple(LLAMA_CPP_VERSION):
        return False, f"llama_cpp {version} is older than {LLAMA_CPP_VERSION}"
    return True, f"llama_cpp {version}"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llama_build.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cmake-args", help="print the CMAKE_ARGS to build llama-cpp-python with on this machine")
    sub.add_parser("describe", help="print what kind of build that is, and why")
    sub.add_parser("pip-cmake-args", help="print the CMAKE_ARGS pip's build gets (cmake-args, kept to the library)")
    p_tools = sub.add_parser("tools", help="print the CMake targets that setup's tool flags ask for")
    p_tools.add_argument("flags", help="comma-separated: " + ", ".join(TOOLS))
    sub.add_parser("tool-cmake-args", help="print the -D flags that add llama.cpp's tools to the build tree")
    p_tree = sub.add_parser("tree-ok", help="exit 0 if BUILD_DIR is a tree of SOURCE_DIR made with CMAKE_ARGS")
    p_tree.add_argument("build_dir", type=Path)
    p_tree.add_argument("source_dir", type=Path)
    p_tree.add_argument("cmake_args")
    p_inst = sub.add_parser("installed", help="exit 0 if llama_cpp imports and is new enough")
    p_inst.add_argument("--python", default=sys.executable)
    p_check = sub.add_parser("check", help="load MODEL and decode a token in a subprocess: ok or crashed")
    p_check.add_argument("model", type=Path)
    p_check.add_argument("--python", default=sys.executable, help="the interpreter whose llama_cpp to test")
    p_check.add_argument("--expect-gpu", action="store_true", help="exit 3 if built without GPU offload")
    args = parser.parse_args(argv)

    if args.command in ("cmake-args", "describe"):
        info = detect()
        if args.command == "describe":
            print(describe(info))
        else:
            if info.user_cmake_args is not None and info.user_cmake_args.strip():
                print("llama_build: CMAKE_ARGS is set in the environment; using it as given", file=sys.stderr)
            print(choose_cmake_args(info))
        return 0
    if args.command == "pip-cmake-args":
        print(pip_cmake_args(detect()))
        return 0
    if args.command == "tools":
        try:
            print(" ".join(tool_targets(args.flags)))
        except ValueError as exc:
            print(f"llama_build: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "tool-cmake-args":
        print(" ".join(TOOL_CMAKE_ARGS))
        return 0
    if args.command == "tree-ok":
        ok, why = tree_reusable(args.build_dir, args.source_dir, args.cmake_args)
        print(why, file=sys.stderr)
        return 0 if ok else 1
    if args.command == "installed":
        ok, message = installed(args.python)
        print(message, file=sys.stderr)
        return 0 if ok else 1
    result = check(args.model, python=args.python, expect_gpu=args.expect_gpu)
    print(result.message, file=sys.stdout if result.code == OK else sys.stderr)
    return result.code


if __name__ == "__main__":
    sys.exit(main())
