"""Numbers that hold on a busy machine: the one estimator, and the interference measured.

Interference only ever adds time, so a timed figure is estimated by a stated low quantile of its
repeats (QUANTILE, nearest rank: the ceil(q x n)-th smallest sample; the minimum when q is 0), the
way timeit and pyperf do, and its spread is kept beside it (SPREAD_RULE). How much of each timed
region the process actually ran on a CPU is read, not guessed: process CPU time (all threads)
against wall time x the threads it could use (min(torch threads, usable cores)); the rest of the
wall time went to other work or to waiting (BUSY_RULE). The machine's load average is kept too.

A figure is noisy when its spread passes SPREAD_LIMIT or other work took more than BUSY_LIMIT of
this process's CPUs during it; the reason says which, in words a learner can read. Where the OS
gives no CPU times, the spread alone decides and the reason says so; on a GPU too (the host's CPU
share says nothing about the device), silently.

The clocks are injectable (Clocks: wall, cpu, load) so tests check the bookkeeping on synthetic
timings, never on this machine's speed.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from explorer._format import NA

QUANTILE = 0.25  # the stated low quantile (used when the repeats allow it; else the minimum)
SPREAD_LIMIT = 0.15  # (median - estimate) / estimate above this: noisy
BUSY_LIMIT = 0.25  # share of this process's CPUs other work took above this: noisy
SPREAD_RULE = "spread = (median - estimate) / estimate, over the timed repeats"
BUSY_RULE = (
    "other work's share = 1 - process CPU time / (wall time x threads), threads = min(torch "
    "threads, usable cores), summed over the timed regions"
)
NO_CPU_TIMES = "CPU times cannot be read on this OS: noise judged from the spread alone"


class TooFewRepeats(ValueError):
    """Repeats too few for the stated quantile (the message says the minimum it needs)."""


def min_repeats(quantile: float) -> int:
    """The fewest repeats n that can estimate the q-quantile: n x q >= 1, so that at least one
    sample lies at or below it (1 for q = 0, the minimum)."""
    if not 0 <= quantile < 1:
        raise ValueError(f"quantile must be in [0, 1), got {quantile!r}")
    return 1 if quantile == 0 else math.ceil(1 / quantile - 1e-9)


def check_repeats(repeats: int, quantile: float) -> None:
    """TooFewRepeats naming the minimum when `repeats` cannot estimate `quantile`."""
    need = min_repeats(quantile)
    if repeats < need:
        raise TooFewRepeats(
            f"a {quantile:g} quantile needs at least {need} repeats, got {repeats}; "
            f"ask for --repeats {need} or more, or quantile 0 (the minimum)"
        )


def quantile_for(repeats: int) -> float:
    """The stated default: QUANTILE when `repeats` allow it, else the minimum (0)."""
    return QUANTILE if repeats >= min_repeats(QUANTILE) else 0.0


def low_quantile(samples: list[float], quantile: float) -> float:
    """The nearest-rank q-quantile: the ceil(q x n)-th smallest sample (the minimum for q = 0)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, math.ceil(quantile * len(ordered) - 1e-9))
    return ordered[rank - 1]


def median(samples: list[float]) -> float:
    if not samples:
        return float("nan")
    s, n = sorted(samples), len(samples)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def relative_spread(samples: list[float], estimate: float) -> float:
    """SPREAD_RULE: how far the typical repeat sits above the estimate (0 for one repeat)."""
    if len(samples) < 2 or not estimate > 0:
        return 0.0
    return max(0.0, (median(samples) - estimate) / estimate)


# --- the clocks ------------------------------------------------------------------------------------


def _cpu_seconds() -> float | None:
    """This process's CPU time, all threads (ns resolution on Linux); None where unreadable."""
    try:
        return time.process_time()
    except (OSError, AttributeError):  # pragma: no cover - platform dependent
        return None


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # Windows has no load average
        return None


@functools.cache
def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


@dataclass
class Clocks:
    """Where the wall time, the process CPU time and the load come from (tests inject fakes)."""

    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float | None] = _cpu_seconds
    load: Callable[[], float | None] = _load


CLOCKS = Clocks()


@dataclass
class Usage:
    """Wall and CPU seconds summed over timed regions, with the threads the process could use."""

    threads: int = 1
    wall_s: float = 0.0
    cpu_s: float | None = 0.0  # None: the OS gave no CPU times
    on_cpu: bool = True  # False: the work ran on a GPU; the CPU share is not its interference

    def add(self, wall_s: float, cpu_s: float | None) -> None:
        self.wall_s += wall_s
        self.cpu_s = None if cpu_s is None or self.cpu_s is None else self.cpu_s + cpu_s

    @property
    def cpu_share(self) -> float | None:
        """CPU time / (wall x threads), capped at 1; None without CPU times or wall time, and off
        a CPU."""
        if self.cpu_s is None or not self.wall_s > 0 or not self.on_cpu:
            return None
        return min(1.0, self.cpu_s / (self.wall_s * max(self.threads, 1)))


class Region:
    """`with region(usage, clocks):` adds one region's wall and CPU seconds to `usage`; the wall
    seconds land in .seconds."""

    def __init__(self, usage: Usage, clocks: Clocks = CLOCKS):
        self.usage, self.clocks, self.seconds = usage, clocks, 0.0

    def __enter__(self) -> Region:
        self._cpu0, self._t0 = self.clocks.cpu(), self.clocks.wall()
        return self

    def __exit__(self, *exc) -> None:
        t1, cpu1 = self.clocks.wall(), self.clocks.cpu()
        self.seconds = t1 - self._t0
        cpu = None if cpu1 is None or self._cpu0 is None else cpu1 - self._cpu0
        self.usage.add(self.seconds, cpu)


def verdict(spread: float, cpu_share: float | None, cpu_readable: bool) -> tuple[bool, str]:
    """(noisy, reason) of a figure from its spread and its CPU share (see the module's rules)."""
    busy = cpu_share is not None and 1 - cpu_share > BUSY_LIMIT
    wide = spread > SPREAD_LIMIT
    reasons = []
    if busy:
        reasons.append(
            f"other work took {100 * (1 - cpu_share):.0f}% of this CPU during this measurement"
        )
    if wide:
        reasons.append(f"its repeats spread {100 * spread:.0f}% above the estimate")
    if not cpu_readable:
        reasons.append(NO_CPU_TIMES)
    return busy or wide, "; ".join(reasons)


def quantile_name(quantile: float) -> str:
    return "minimum" if quantile == 0 else f"p{100 * quantile:g}"


def describe(m: dict, scale: float = 1e3, unit: str = "ms") -> str:
    """One timed figure (a Measurement.to_dict()) as a reader sees it: the estimate, which quantile
    of how many repeats, its spread, and the noisy mark with its reason."""
    share = m.get("cpu_share")
    busy = f"CPU share {NA}" if share is None else f"on a CPU {100 * share:.0f}% of the time"
    text = (
        f"{m['estimate_s'] * scale:.4g} {unit} ({quantile_name(m['quantile'])} of {m['repeats']}, "
        f"median {m['median_s'] * scale:.4g}, spread {100 * m['spread']:.0f}%, {busy})"
    )
    if m.get("noisy"):
        return f"{text}  NOISY: {m['reason']}"
    return f"{text}  ({m['reason']})" if m.get("reason") else text


def busy_reason(cpu_share: float | None) -> str | None:
    """The noisy reason of one timed region (e.g. a Step) from its CPU share alone (one sample: no
    spread); None when it is not noisy or the share is unknown."""
    if cpu_share is None or 1 - cpu_share <= BUSY_LIMIT:
        return None
    return f"other work took {100 * (1 - cpu_share):.0f}% of this CPU during this measurement"


def noisy_summary(flags, reasons) -> str:
    """'N of M points noisy (the first reason)' over a frame's noisy / noisy_reason columns (any
    iterables; None for a frame without them); "" when none is noisy."""
    if flags is None:
        return ""
    flags = [f is True or f == 1 for f in flags]
    reasons = list(reasons) if reasons is not None else [""] * len(flags)
    first = next((r for f, r in zip(flags, reasons, strict=False) if f and r), "")
    n = sum(flags)
    return f"{n} of {len(flags)} points noisy ({first})" if n else ""
