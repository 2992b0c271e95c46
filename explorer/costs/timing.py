"""Timing done right: synchronise the device around each timed region, discard warm-up, report medians.

On CUDA the timer uses CUDA events (elapsed_time between recorded events, after a synchronise);
on CPU and MPS it uses time.perf_counter around a device synchronise.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on `device` is done (a no-op on CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


@dataclass
class Timer:
    """Measures one region: `with timer.region(): ...`; the seconds land in `timer.seconds`."""

    device: torch.device
    seconds: float = 0.0

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
        t0 = time.perf_counter()
        yield self
        synchronize(self.device)
        self.seconds = time.perf_counter() - t0


def time_call(fn: Callable[[], object], device: torch.device | str) -> tuple[object, float]:
    """Run fn once, timed; returns (result, seconds)."""
    timer = Timer(torch.device(device))
    with timer.region():
        out = fn()
    return out, timer.seconds


def alternate(arms: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each arm's sample (a callable returning one number, e.g. seconds), `repeats` times, in
    alternating order (A B, B A, ...) so slow drift in a shared machine's load hits every arm alike."""
    names = list(arms)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            out[n].append(arms[n]())
    return out


@dataclass
class Measurement:
    """Repeated timings of one thing: median and spread, with how it was measured."""

    samples: list[float] = field(default_factory=list)
    warmup: int = 0
    method: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.samples), max(self.samples)) if self.samples else (float("nan"),) * 2

    def to_dict(self) -> dict:
        return {
            "median_s": self.median,
            "min_s": self.spread[0],
            "max_s": self.spread[1],
            "repeats": len(self.samples),
            "warmup": self.warmup,
            "method": self.method,
        }


def measure(
    fn: Callable[[], object], device: torch.device | str, *, repeats: int = 5, warmup: int = 1
) -> Measurement:
    """Time fn `repeats` times after `warmup` untimed calls."""
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(dev)
    samples = [time_call(fn, dev)[1] for _ in range(repeats)]
    return Measurement(samples=samples, warmup=warmup, method=Timer(dev).method)
