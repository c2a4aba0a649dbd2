"""What machine this is, in the words reports and caches use (no llama.cpp needed)."""

from __future__ import annotations

import functools
import platform


@functools.cache
def processor_name() -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
