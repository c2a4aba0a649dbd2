"""`--verbose` shows llama.cpp's own log on stderr; without it, llama.cpp says nothing."""

from __future__ import annotations

from tests.conftest import localspec

LLAMA_LOG_MARKERS = ("llama_model_load", "print_info", "load_tensors")


def test_verbose_shows_llama_cpp_log_and_the_default_hides_it(model_path):
    args = ["run", "hi", "--max-tokens", "1", "--drafter", "none"]
    loud = localspec([*args, "--verbose"])
    assert loud.code == 0, loud.stderr
    assert "Traceback" not in loud.stderr
    assert all(marker in loud.stderr for marker in LLAMA_LOG_MARKERS), loud.stderr[-2000:]
    quiet = localspec(args)
    assert quiet.code == 0, quiet.stderr
    assert not any(marker in quiet.stderr for marker in LLAMA_LOG_MARKERS), quiet.stderr
    assert loud.stdout == quiet.stdout
