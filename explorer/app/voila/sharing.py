"""How many kernels share this machine, and how many torch threads each gets.

A classroom Voila server runs one kernel per visitor (plus its preheated pool) on the same cores.
With every kernel's torch team as wide as the machine, two visitors stepping at once thrash each
other (each team spins on cores the other holds): each kernel gets its share instead,

    threads per kernel = max(1, (cores - 1) // kernels)      (THREADS_RULE; one core is left to
                                                               the server and the browser)

with kernels = the pool size (the kernels the server keeps ready: the visitors it expects at
once), at least 1. kernels_sharing() counts the kernels running beside this one (the processes
with this kernel's parent, the server, whose command line runs ipykernel; Linux only), and
sharing_note() says it on the dashboard's first message.
"""

from __future__ import annotations

import os
from pathlib import Path

THREADS_RULE = "threads per kernel = max(1, (cores - 1) // kernels), kernels = the pool size"


def kernel_threads(cores: int | None, kernels: int) -> int:
    """THREADS_RULE: torch threads for each of `kernels` kernels on `cores` cores."""
    return max(1, ((cores or 2) - 1) // max(1, kernels))


def _ppid_and_cmd(pid: str, proc: Path) -> tuple[int, str] | None:
    try:
        stat = (proc / pid / "stat").read_text()
        cmd = (proc / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone, or not ours to read
        return None
    return int(stat.rsplit(")", 1)[1].split()[1]), cmd


def kernels_sharing(parent: int | None = None, proc: Path = Path("/proc")) -> int | None:
    """The ipykernel processes started by `parent` (default: this process's parent, the server),
    this one included; None where /proc cannot be read (not Linux)."""
    parent = os.getppid() if parent is None else parent
    if not proc.is_dir():
        return None
    count = 0
    for pid in (p.name for p in proc.iterdir() if p.name.isdigit()):
        got = _ppid_and_cmd(pid, proc)
        if got is not None and got[0] == parent and "ipykernel" in got[1]:
            count += 1
    return count


def sharing_note(env: dict | None = None) -> str:
    """One sentence for a kernel served by `explorer app` (EXPLORER_APP_KERNEL set): how many
    kernels share the machine's cores and the threads this one's torch uses; "" elsewhere."""
    env = os.environ if env is None else env
    if not env.get("EXPLORER_APP_KERNEL"):
        return ""
    import torch

    kernels, cores = kernels_sharing(), os.cpu_count() or 1
    who = (
        f"{kernels} kernels (visitors' sessions and ready ones) share"
        if kernels
        else "This kernel and the server's others share"
    )
    return (
        f"{who} this machine's {cores} cores; this one runs torch on {torch.get_num_threads()} "
        "thread(s), so a step takes longer while others step too (timings say when: noisy)."
    )
