"""What machine this is, in the words reports and caches use (no llama.cpp needed)."""

from __future__ import annotations

import functools
import os
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


def usable_cores() -> int:
    """The cores this process may run on (taskset, a container's cpuset), else the machine's: llama.cpp on more
    threads than that runs some passes ~100x slower, its threads waiting on each other (docs/performance.md)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
