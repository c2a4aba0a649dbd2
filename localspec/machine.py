"""What machine this is, in the words reports and caches use (no llama.cpp needed)."""

from __future__ import annotations

import functools
import os
import platform
import time


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


class OtherLoad:
    """The CPU time other processes use from now on, in cores (Linux: /proc/stat; None where it cannot tell)."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), _system_busy(), _own_cpu())

    def cores(self) -> float | None:
        wall0, busy0, own0 = self._start
        busy1 = _system_busy()
        if busy0 is None or busy1 is None:
            return None
        wall = time.monotonic() - wall0
        return max(0.0, (busy1 - busy0) - (_own_cpu() - own0)) / wall if wall > 0 else None


def _system_busy() -> float | None:
    """CPU seconds every process has used since boot on the cores this process may run on (another process pinned
    to other cores does not slow it), steal time (the hypervisor's other guests) included."""
    try:
        mine = {f"cpu{n}" for n in os.sched_getaffinity(0)}
    except AttributeError:  # not Linux: the machine's total line
        mine = None
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    rows = [line for line in lines[1:] if line[0] in mine] if mine else lines[:1]
    try:
        total = 0
        for row in rows or lines[:1]:
            user, nice, system, _idle, _iowait, irq, softirq, steal = ([int(x) for x in row[1:]] + [0] * 8)[:8]
            total += user + nice + system + irq + softirq + steal
    except ValueError:
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system
