"""The server's kernels as processes: which they are, when the pool is ready, their memory, the capacity.

kernel_processes(server_pid)         the kernels a server has started (psutil.Process list)
wait_for_pool(server_pid, n)         wait until n kernels exist and have finished rendering the notebook
tree_memory(server_pid)              memory of the server and all its children (rss, pss, uss)
measure_capacity(server_pid)         one kernel's memory after the dashboard loaded -> Capacity
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

KERNEL_MARKER = "ipykernel_launcher"


def kernel_processes(server_pid: int) -> list:
    """The live kernel processes (psutil.Process) started by the server with pid `server_pid`."""
    import psutil

    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in children:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(
                KERNEL_MARKER in part for part in p.cmdline()
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _cpu_seconds(p) -> float:
    t = p.cpu_times()
    return t.user + t.system


def wait_for_pool(server_pid: int, n: int, timeout: float = 120.0, quiet_s: float = 1.0) -> float:
    """Wait until the server has >= n kernels and all of them have gone quiet (used < 2% CPU for `quiet_s`).

    With preheating, a quiet pool kernel has executed the whole notebook (the Dashboard is built).
    Returns the seconds waited; raises RuntimeError on timeout.
    """
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        kernels = kernel_processes(server_pid)
        if len(kernels) >= n:
            try:
                before = [_cpu_seconds(p) for p in kernels]
                time.sleep(quiet_s)
                used = [_cpu_seconds(p) - b for p, b in zip(kernels, before)]
            except psutil.Error:
                continue
            if all(u < 0.02 * quiet_s for u in used):
                return time.perf_counter() - t0
        else:
            time.sleep(0.2)
    raise RuntimeError(f"{n} quiet kernel(s) did not appear within {timeout:.0f} s")


def process_memory(p) -> dict:
    """rss, uss (private) and pss (proportional share) bytes of one process (psutil; Linux has all three)."""
    full = p.memory_full_info()
    return {
        "rss": full.rss,
        "uss": getattr(full, "uss", full.rss),
        "pss": getattr(full, "pss", full.rss),
    }


def tree_memory(server_pid: int) -> dict:
    """Memory of the server plus all its children, summed: rss (counts shared pages repeatedly), pss, uss."""
    import psutil

    total = {"rss": 0, "uss": 0, "pss": 0, "processes": 0}
    try:
        root = psutil.Process(server_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for p in procs:
        try:
            m = process_memory(p)
        except psutil.Error:
            continue
        for k in ("rss", "uss", "pss"):
            total[k] += m[k]
        total["processes"] += 1
    return total


@dataclass
class Capacity:
    """How many more visitors fit in memory, measured from one preheated kernel (dashboard built)."""

    kernel_uss: int  # private bytes of one kernel: what each extra visitor costs
    kernel_rss: int  # includes libraries shared with the other kernels
    available: int  # bytes the OS reports available now (psutil.virtual_memory().available)
    visitors: int  # available // kernel_uss

    def line(self) -> str:
        mb = 1024 * 1024
        return (
            f"this machine can hold about {self.visitors} visitors (one kernel ≈ {self.kernel_uss / mb:.0f} MB, "
            f"{self.available / mb:.0f} MB free)"
        )

    def detail(self) -> str:
        mb = 1024 * 1024
        return (
            f"  measured: private memory (USS) of one preheated kernel after the dashboard loaded; its RSS is "
            f"{self.kernel_rss / mb:.0f} MB incl. libraries shared between kernels. A visitor's kernel grows "
            f"as they step and load bigger models; CPU time is shared by all visitors ({os.cpu_count()} cores)."
        )


def capacity_from(kernel: dict, available: int) -> Capacity:
    """Capacity from one kernel's process_memory() and the available bytes: visitors = available // uss."""
    if kernel["uss"] <= 0:
        raise ValueError("kernel memory must be positive")
    return Capacity(
        kernel_uss=kernel["uss"],
        kernel_rss=kernel["rss"],
        available=available,
        visitors=int(available // kernel["uss"]),
    )


def measure_capacity(server_pid: int, timeout: float = 120.0) -> Capacity:
    """Wait for a quiet preheated kernel, then measure it and the memory still available."""
    import psutil

    wait_for_pool(server_pid, 1, timeout=timeout)
    kernels = kernel_processes(server_pid)
    one = max((process_memory(p) for p in kernels), key=lambda m: m["uss"])
    return capacity_from(one, psutil.virtual_memory().available)
