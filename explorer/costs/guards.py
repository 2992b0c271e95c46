"""Measurements a busy machine cannot flip: pinned threads, repeats with their spread, a machine
check against a calibration, and a guard for rows that no physics allows. UI-free, no sweep import.

    guards.pin_threads(THREADS)                        # torch.set_num_threads, said back
    guards.spread([0.011, 0.012, 0.013]).text          # "12.0 ms (11.0-13.0 ms over 3, +-8%)"
    guards.machine_check(measured_s, predicted_s)      # .ok, .line: warns past 25% off
    guards.step_check(lm, calibration)                 # one decode step, measured vs predicted
    guards.impossible_rows(rows)                       # pays rows no machine can produce

Why: at torch's default of one thread per core, a 2-core machine that is also doing other work
ran a small decode step 3-6x slower and with wild variance; pinned to one thread it ran steadily.
A figure measured once cannot tell noise from an effect, and a fitted model reused from another
moment of the machine is only as good as that moment: so a notebook pins its threads, repeats,
shows the spread, checks one step against the model it reuses, and flags what cannot be.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from explorer.costs.speculation import expected_speedup

TOLERANCE = 0.25  # a step more than 25% off the model's prediction: refit or warn
SLACK = 0.10  # a longer pass may look this much faster than a shorter one (noise), no more
THREADS_ENV = ("EXPLORER_THREADS", "OMP_NUM_THREADS")


def default_threads() -> int:
    """The threads a notebook pins by default: EXPLORER_THREADS, else OMP_NUM_THREADS, else 1."""
    for name in THREADS_ENV:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return 1


def pin_threads(threads: int | None = None) -> int:
    """torch.set_num_threads(threads) (None: default_threads()); returns the count now in use.
    ValueError (one line) for anything but a whole number >= 1."""
    n = default_threads() if threads is None else threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"THREADS must be a whole number >= 1, got {threads!r}")
    torch.set_num_threads(n)
    return torch.get_num_threads()


@dataclass(frozen=True)
class Spread:
    """Repeats of one timing: median, lowest, highest, how many."""

    median: float
    low: float
    high: float
    n: int

    @property
    def pct(self) -> float:
        """Half the range as a percentage of the median (0 for one repeat)."""
        return 0.0 if self.median <= 0 else 50.0 * (self.high - self.low) / self.median

    @property
    def text(self) -> str:
        ms = 1e3
        return (
            f"{self.median * ms:.3g} ms ({self.low * ms:.3g}-{self.high * ms:.3g} ms over "
            f"{self.n}, +-{self.pct:.0f}%)"
        )


def spread(samples: Iterable[float]) -> Spread:
    """The spread of timed repeats (seconds). ValueError for no samples."""
    xs = [float(x) for x in samples]
    if not xs:
        raise ValueError("spread: no samples")
    return Spread(statistics.median(xs), min(xs), max(xs), len(xs))


@dataclass(frozen=True)
class MachineCheck:
    """One measured step against what a fitted model (calibration, profile) predicts for it."""

    measured_s: float
    predicted_s: float
    tolerance: float = TOLERANCE
    what: str = "a decode step"

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s

    @property
    def ok(self) -> bool:
        return abs(self.ratio - 1) <= self.tolerance

    @property
    def line(self) -> str:
        off = f"{(self.ratio - 1) * 100:+.0f}%"
        said = (
            f"{self.what}: measured {self.measured_s * 1e3:.3g} ms, the model predicts "
            f"{self.predicted_s * 1e3:.3g} ms ({off})"
        )
        if self.ok:
            return f"machine check ok: {said}, within {self.tolerance:.0%}"
        return (
            f"machine check FAILED: {said}, beyond {self.tolerance:.0%}: the machine is not the "
            "one the model was fitted on (load, threads, clock): refit it, or read every "
            "prediction below as stale"
        )


def machine_check(
    measured_s: float, predicted_s: float, tolerance: float = TOLERANCE, what: str = "a decode step"
) -> MachineCheck:
    """A MachineCheck; ValueError (one line) for a time that is not positive."""
    for name, v in (("measured_s", measured_s), ("predicted_s", predicted_s)):
        if not (isinstance(v, (int, float)) and v > 0 and v == v):
            raise ValueError(
                f"machine_check: {name} must be a positive number of seconds, got {v!r}"
            )
    return MachineCheck(float(measured_s), float(predicted_s), tolerance, what)


def time_decode_step(lm, *, batch: int = 1, context: int = 64, repeats: int = 3) -> Spread:
    """One cached decode step (batch rows, `context` tokens in the cache), timed `repeats` times
    after one warm-up (the cache cropped back after each)."""
    from transformers import DynamicCache

    from explorer.costs.timing import measure
    from explorer.model.passes import crop_cache, forward

    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, lm.info.vocab_size, (batch, context), generator=gen).to(lm.device)
    cache = DynamicCache()
    forward(lm.model, ids[:, :-1], cache, last_only=True)  # [B, context - 1] into the cache

    def step():
        out = forward(lm.model, ids[:, -1:], cache, last_only=True)  # [B, 1]
        crop_cache(cache, context - 1)
        return out

    return spread(measure(step, lm.device, repeats=repeats, warmup=1).samples)


def step_check(
    lm, cal, *, batch: int = 1, context: int = 64, repeats: int = 3, tolerance: float = TOLERANCE
) -> MachineCheck:
    """One measured decode step (median of `repeats`) against the calibration's prediction."""
    from explorer import costs

    cost = costs.forward_cost(
        lm.info, batch=batch, tokens_fed=1, context_len=context, logits_positions=1
    )
    predicted = cal.predict(
        bytes=cost.bound_bytes, flops=cost.total_flops, layers=lm.info.layers, rows=batch
    )
    measured = time_decode_step(lm, batch=batch, context=context, repeats=repeats).median
    what = f"a batch-{batch} decode step at context {context}"
    return machine_check(measured, predicted, tolerance, what)


# --- rows no machine can produce -----------------------------------------------------------------


def longer_not_faster(
    values: Sequence[float], times: Sequence[float | None], slack: float = SLACK, what: str = "pass"
) -> list[str]:
    """More work in less time: a row whose time is more than `slack` below the time of a row with
    a smaller value (the values measure the work, e.g. tokens fed to an uncached pass)."""
    pts = sorted((v, t) for v, t in zip(values, times, strict=True) if t is not None and t == t)
    out = []
    for i, (v, t) in enumerate(pts):
        for v0, t0 in pts[:i]:
            if v > v0 and t < t0 * (1 - slack):
                out.append(
                    f"impossible row: the {what} at {v:g} ({t * 1e3:.3g} ms) beat the one at "
                    f"{v0:g} ({t0 * 1e3:.3g} ms), with more work: the machine changed under the "
                    "run (load, threads); rerun with THREADS pinned and more repeats"
                )
                break
    return out


def beyond_bound(
    values: Sequence, speedups: Sequence[float | None], bounds: Sequence[float | None], why: str
) -> list[str]:
    """Rows whose measured speedup exceeds its stated bound (None: no bound for that row)."""
    out = []
    for v, s, b in zip(values, speedups, bounds, strict=True):
        if s is not None and b is not None and s == s and s > b:
            out.append(
                f"impossible row: speedup {s:.2f} at {v} exceeds its bound {b:.2f} ({why}): "
                "a timing, not the trick; rerun with THREADS pinned and more repeats"
            )
    return out


def speculative_bound(alpha: float, k: int, draft_cost: float) -> float:
    """Leviathan et al.'s speedup with a free verify (v = 1: k+1 tokens scored for the price of
    one target pass): no speculative decoder with this alpha and draft cost c does better."""
    return expected_speedup(alpha, k, draft_cost, 1.0)


INT8_BOUND = 4.0  # fp32 -> int8 moves a quarter of the weight bytes and fbgemm's int8 GEMMs
CONTINUOUS_EQUAL_BOUND = 1.5  # at equal lengths static and continuous run the same iterations


def impossible_rows(rows: Sequence[dict], attrs: dict | None = None) -> list[str]:
    """The pays rows (explorer.sweeps.pays) that no machine can produce, one line each:
    kv-cache: a longer uncached pass faster than a shorter one, or a speedup above L + 1 times
    (the uncached pass does about L times a cached step's work); int8: above 4x; speculative
    (batch axis): above Leviathan's bound at the measured alpha and the row's draft cost when the
    attrs carry them (attrs['k'], attrs['alpha'][k], attrs['draft_cost'][batch]); continuous at
    spread 0: above 1.5x."""
    attrs = attrs or {}
    rows = [r for r in rows if r.get("skipped") is None]
    if not rows:
        return []
    trick = rows[0].get("trick")
    values = [r["value"] for r in rows]
    speedups = [r.get("speedup") for r in rows]
    if trick == "kv-cache":
        out = longer_not_faster(values, [r.get("baseline_s") for r in rows], what="uncached pass")
        bounds = [v + 1 for v in values]
        return out + beyond_bound(values, speedups, bounds, "L + 1: the work of L cached steps")
    if trick == "int8":
        return beyond_bound(values, speedups, [INT8_BOUND] * len(rows), "a quarter of the bytes")
    if trick == "continuous":
        bounds = [CONTINUOUS_EQUAL_BOUND if v == 0 else None for v in values]
        return beyond_bound(values, speedups, bounds, "equal lengths: the same iterations")
    if trick == "speculative" and attrs.get("draft_cost") and attrs.get("k"):
        k = attrs["k"]
        alpha = (attrs.get("alpha") or {}).get(k)
        costs = attrs["draft_cost"]  # by batch (the pays sweep), or one figure for every row
        cost = [costs.get(v) if isinstance(costs, dict) else costs for v in values]
        if alpha is None:
            return []
        bounds = [None if c is None else speculative_bound(alpha, k, c) for c in cost]
        return beyond_bound(values, speedups, bounds, "Leviathan, free verify")
    return []
