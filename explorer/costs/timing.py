"""Timing done right: synchronise the device around each timed region, discard warm-up, alternate
the arms, report a stated low quantile with its spread and how busy the machine was (noise).

On CUDA the timer uses CUDA events (elapsed_time between recorded events, after a synchronise);
on CPU and MPS it uses time.perf_counter around a device synchronise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from explorer.costs import noise


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on `device` is done (a no-op on CPU)."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


@dataclass
class Timer:
    """Measures one region: `with timer.region(): ...`; the seconds land in `timer.seconds`. On a
    CPU the process's CPU time is read around it too (two clock reads): `timer.cpu_share`."""

    device: torch.device
    seconds: float = 0.0
    cpu_s: float | None = None  # process CPU time (all threads) during the region; CPU only

    @property
    def cpu_share(self) -> float | None:
        """CPU time / (wall x threads) of the last region (explorer.costs.noise); None off a CPU
        or where the OS gives no CPU times."""
        if self.cpu_s is None or not self.seconds > 0:
            return None
        return min(1.0, self.cpu_s / (self.seconds * _threads(None)))

    @property
    def method(self) -> str:
        return "cuda events" if self.device.type == "cuda" else "perf_counter after device sync"

    @contextmanager
    def region(self):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            synchronize(self.device)
            start.record()
            yield self
            end.record()
            end.synchronize()
            self.seconds = start.elapsed_time(end) / 1e3
            return
        synchronize(self.device)
        cpu = self.device.type == "cpu"
        c0 = noise.CLOCKS.cpu() if cpu else None
        t0 = time.perf_counter()
        yield self
        synchronize(self.device)
        self.seconds = time.perf_counter() - t0
        c1 = noise.CLOCKS.cpu() if cpu else None
        self.cpu_s = None if c0 is None or c1 is None else c1 - c0


def time_call(fn: Callable[[], object], device: torch.device | str) -> tuple[object, float]:
    """Run fn once, timed; returns (result, seconds)."""
    timer = Timer(torch.device(device))
    with timer.region():
        out = fn()
    return out, timer.seconds


def _threads(threads: int | None) -> int:
    """The CPUs a timed region can use: min(torch threads, usable cores)."""
    return max(1, min(threads or torch.get_num_threads(), noise.usable_cores()))


def usage_for(dev: torch.device, threads: int | None) -> noise.Usage:
    """A Usage for regions on `dev`: off a CPU the CPU share says nothing about the device (the
    host waits on it), so only the spread decides there."""
    return noise.Usage(threads=_threads(threads), on_cpu=dev.type == "cpu")


@dataclass
class Measurement:
    """Repeated timings of one thing: the estimate (a stated low quantile), its spread, and how
    busy the machine was while it was measured (explorer.costs.noise)."""

    samples: list[float] = field(default_factory=list)
    warmup: int = 0
    method: str = ""
    quantile: float | None = None  # None: the stated default for this many repeats
    usage: noise.Usage = field(default_factory=noise.Usage)
    load: float | None = None  # the machine's 1-minute load average at the end
    results: list = field(default_factory=list, repr=False)  # what fn returned (alternate(keep=))

    def __post_init__(self) -> None:
        if self.quantile is None:
            self.quantile = noise.quantile_for(len(self.samples))

    @property
    def repeats(self) -> int:
        return len(self.samples)

    @property
    def estimate(self) -> float:
        return noise.low_quantile(self.samples, self.quantile)

    @property
    def median(self) -> float:
        return noise.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples) if self.samples else float("nan")

    @property
    def high(self) -> float:
        return max(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> float:
        return noise.relative_spread(self.samples, self.estimate)

    @property
    def cpu_share(self) -> float | None:
        return self.usage.cpu_share

    @property
    def cpu_readable(self) -> bool:
        return self.usage.cpu_s is not None

    @property
    def noisy(self) -> bool:
        return noise.verdict(self.spread, self.cpu_share, self.cpu_readable)[0]

    @property
    def reason(self) -> str:
        return noise.verdict(self.spread, self.cpu_share, self.cpu_readable)[1]

    def to_dict(self) -> dict:
        return {
            "estimate_s": self.estimate,
            "quantile": self.quantile,
            "spread": self.spread,
            "median_s": self.median,
            "min_s": self.low,
            "max_s": self.high,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "method": self.method,
            "threads": self.usage.threads,
            "cpu_share": self.cpu_share,
            "load": self.load,
            "noisy": self.noisy,
            "reason": self.reason,
        }


def _timed(fn, dev: torch.device, usage: noise.Usage, clocks: noise.Clocks):
    """(result, seconds) of one call, its wall and CPU time added to `usage`."""
    timer = Timer(dev)
    with noise.Region(usage, clocks) as region, timer.region():
        out = fn()
    return out, timer.seconds if dev.type == "cuda" else region.seconds


def alternate(
    arms: dict[str, Callable[[], object]],
    repeats: int,
    device: torch.device | str = "cpu",
    *,
    warmup: int = 0,
    quantile: float | None = None,
    tick: Callable[[], None] | None = None,
    own_figure: bool = False,
    keep: bool = False,
    after: Callable[[], object] | None = None,
    threads: int | None = None,
    clocks: noise.Clocks = noise.CLOCKS,
) -> dict[str, Measurement]:
    """Each arm timed `repeats` times after `warmup` untimed calls of each, in alternating order
    (A B, B A, ...) so slow drift in a shared machine's load hits every arm alike. `own_figure`:
    an arm returns its own sample (e.g. seconds per token) instead of its call being timed; `keep`:
    the arms' results are kept in .results; `after` runs untimed after every call (e.g. crop a
    cache back). `tick` runs after each round. TooFewRepeats when
    `repeats` cannot estimate `quantile`."""
    if quantile is not None:
        noise.check_repeats(repeats, quantile)
    dev, names = torch.device(device), list(arms)
    for _ in range(warmup):
        for n in names:
            arms[n]()
            if after is not None:
                after()
    synchronize(dev)
    usages = {n: usage_for(dev, threads) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, list] = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            out, seconds = _timed(arms[n], dev, usages[n], clocks)
            if after is not None:
                after()
            samples[n].append(float(out) if own_figure else seconds)
            if keep:
                results[n].append(out)
        if tick is not None:
            tick()
    load, method = clocks.load(), Timer(dev).method
    return {
        n: Measurement(samples[n], warmup, method, quantile, usages[n], load, results[n])
        for n in names
    }


def measure(
    fn: Callable[[], object],
    device: torch.device | str,
    *,
    repeats: int = 5,
    warmup: int = 1,
    quantile: float | None = None,
    tick: Callable[[], None] | None = None,
    after: Callable[[], object] | None = None,
    threads: int | None = None,
    clocks: noise.Clocks = noise.CLOCKS,
) -> Measurement:
    """Time fn `repeats` times after `warmup` untimed calls (the one-arm alternate())."""
    arms = {"fn": fn}
    kw = dict(warmup=warmup, quantile=quantile, tick=tick, after=after, threads=threads)
    kw["clocks"] = clocks
    return alternate(arms, repeats, device, **kw)["fn"]
