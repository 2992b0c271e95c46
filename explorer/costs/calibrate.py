"""Calibration: fit the cost model's speeds to a few measured steps, then check it on others.

The roofline bound (explorer.costs.parts.roofline) is a floor, not a prediction: on the bundled
model a decode step takes about 30x its bound (overhead), on a 0.5B shape about 3x. Calibration
turns the cost model into a prediction of the latency itself,

    latency ~ bytes / effective_bandwidth + flops / effective_flops
              + step_overhead_s + layers * layer_overhead_s                 (CALIBRATION_RULE)

("linear"; fit(rule="gemm") adds [rows > 1] * bytes * s_per_byte_multirow, the rule the regime
map's calibration uses: explorer.costs.calibrate_rule says why and how each coefficient is checked
for being determined by the grid, and folded or named when it is not), fitted (non-negative least
squares on the relative error) to measured decode steps, and reports the error on *held-out* steps
that the fit did not see (other context lengths and batch sizes). "Before" is the explorer's
uncalibrated prediction, the roofline bound of the same step; "after" is the calibrated formula.

A point is plain data: {"model", "layers", "batch", "context_len", "latency_s" (measured),
"bytes" (bound bytes: weights + KV, modelled), "flops" (modelled), "bound_s" (modelled)}, and
optionally "device" and "dtype" (the calibration's, when fit() is not told); the
regime-map sweep's rows give them (explorer.sweeps.regime_map.points). A Calibration is plain data
too (to_dict / from_dict), saved with a Trace (Trace.calibration) and used by the predictions
that take one (the regime-map sweep's latency_s_calibrated column, the trust table).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from explorer._format import pct
from explorer.costs import calibrate_rule as rule_
from explorer.costs.calibrate_rule import LINEAR_RULE as CALIBRATION_RULE

PARAMS = ("s_per_byte", "s_per_flop", "step_overhead_s", "layer_overhead_s")
POINT_KEYS = ("model", "layers", "batch", "context_len", "latency_s", "bytes", "flops", "bound_s")

_ACTIVE: dict[tuple, Calibration] = {}


class TooFewPoints(ValueError):
    """A fit that has fewer measured points than it needs (the message says how many)."""


class MachineTooBusy(ValueError):
    """The steps to fit were measured while other work held the CPU (explorer.costs.noise): no fit
    is made, so no bad one is saved or used; the message says how busy, in one line."""


def interference(cells: list[dict]) -> dict[str, Any]:
    """How busy the machine was while the cells were measured: the median CPU share and spread,
    and how many cells were marked noisy (cells: {"cpu_share", "spread", "noisy"})."""
    shares = [c["cpu_share"] for c in cells if c.get("cpu_share") is not None]
    spreads = [c["spread"] for c in cells if c.get("spread") is not None]
    return {
        "cells": len(cells),
        "median_cpu_share": _median(shares),
        "median_spread": _median(spreads),
        "noisy_cells": sum(1 for c in cells if c.get("noisy")),
    }


def too_busy(cells: list[dict]) -> str | None:
    """Why the machine was too busy to fit, in one line, or None: the median interference over
    the measured cells passes noise.BUSY_LIMIT (cells: {"cpu_share", "spread"}; the regime map's
    cpu_share_measured and spread_measured). Without CPU times the median spread decides
    (noise.SPREAD_LIMIT)."""
    from explorer.costs import noise

    shares = [c["cpu_share"] for c in cells if c.get("cpu_share") is not None]
    if shares:
        busy = 1 - statistics.median(shares)
        if busy <= noise.BUSY_LIMIT:
            return None
        return (
            f"the machine is too busy to fit a calibration: other work took {100 * busy:.0f}% "
            f"of this CPU while its steps were measured (median of {len(shares)} cells; "
            f"limit {100 * noise.BUSY_LIMIT:.0f}%)"
        )
    spreads = [c["spread"] for c in cells if c.get("spread") is not None]
    if not spreads or statistics.median(spreads) <= noise.SPREAD_LIMIT:
        return None
    return (
        f"the machine is too busy to fit a calibration: its steps' repeats spread "
        f"{100 * statistics.median(spreads):.0f}% (median of {len(spreads)} cells; limit "
        f"{100 * noise.SPREAD_LIMIT:.0f}%; {noise.NO_CPU_TIMES})"
    )


def check_quiet(cells: list[dict]) -> None:
    """MachineTooBusy (saying why) when too_busy(cells)."""
    reason = too_busy(cells)
    if reason:
        raise MachineTooBusy(reason)


class EffectiveRates:
    """GB/s and GFLOP/s of a fitted model with s_per_byte and s_per_flop (None when 0)."""

    s_per_byte: float
    s_per_flop: float

    @property
    def effective_gbps(self) -> float | None:
        return 1 / self.s_per_byte / 1e9 if self.s_per_byte > 0 else None

    @property
    def effective_gflops(self) -> float | None:
        return 1 / self.s_per_flop / 1e9 if self.s_per_flop > 0 else None


@dataclass
class Calibration(EffectiveRates):
    s_per_byte: float
    s_per_flop: float
    step_overhead_s: float
    layer_overhead_s: float | None  # None: one model shape, folded into step_overhead_s
    models: list[str]
    device: str = ""
    dtype: str = ""
    threads: int | None = None
    rule: str = CALIBRATION_RULE
    n_train: int = 0
    n_heldout: int = 0
    train_err_pct: float | None = None  # median |error| on the points it was fitted to
    heldout_err_before_pct: float | None = None  # the roofline bound's, on the held-out points
    heldout_err_after_pct: float | None = None  # the calibrated formula's, same points
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    interference: dict[str, Any] = field(default_factory=dict)  # how busy the machine was (noise)
    points: list[dict] = field(default_factory=list)  # every measured point, "split": train/heldout
    s_per_byte_multirow: float = 0.0  # the "gemm" rule's extra cost per byte when rows > 1
    folded: dict[str, str] = field(default_factory=dict)  # coefficient -> why not reported
    identifiability: dict[str, Any] = field(default_factory=dict)  # condition, loo_spread, limit
    heldout_err_linear_pct: float | None = None  # the "linear" rule refitted to the same points

    def predict(self, *, bytes: float, flops: float, layers: int, rows: int = 1) -> float:
        """Predicted latency (s) of a pass moving `bytes` (bound bytes) and doing `flops`, whose
        weight matrices see `rows` rows (batch x tokens fed; the multi-row term needs rows > 1)."""
        per_layer = self.layer_overhead_s or 0.0
        multirow = self.s_per_byte_multirow * bytes if rows > 1 else 0.0
        return (
            self.s_per_byte * bytes + multirow + self.s_per_flop * flops + self.step_overhead_s
        ) + layers * per_layer

    def predict_point(self, point: dict) -> float:
        return self.predict(
            bytes=point["bytes"],
            flops=point["flops"],
            layers=point["layers"],
            rows=rule_.rows(point),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["effective_gbps"] = self.effective_gbps
        d["effective_gflops"] = self.effective_gflops
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def load(cls, path) -> Calibration:
        """A saved calibration; ValueError naming the file when it is not one."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a calibration file (not JSON: {err})") from None
        missing = [k for k in PARAMS if not isinstance(data, dict) or k not in data]
        if missing:
            raise ValueError(
                f"{path}: not a calibration file (no {', '.join(missing)}); save one with "
                "`explorer bench calibrate --out FILE`"
            )
        bad = [
            k
            for k in PARAMS
            if not (k == "layer_overhead_s" and data[k] is None)
            and (
                not isinstance(data[k], (int, float))
                or isinstance(data[k], bool)
                or not np.isfinite(data[k])
                or data[k] < 0
            )
        ]
        if bad:
            raise ValueError(
                f"{path}: {', '.join(f'{k}={data[k]!r}' for k in bad)}: each must be a finite "
                "number >= 0"
            )
        try:
            return cls.from_dict(data)
        except TypeError as err:
            raise ValueError(f"{path}: not a calibration file ({err})") from None

    def summary(self) -> str:
        def shown(term: str, text: str) -> str:
            return f"{term} undetermined" if term in self.folded else text

        layer = (
            f"{self.layer_overhead_s * 1e6:.0f} us/layer"
            if self.layer_overhead_s is not None
            else "per-layer overhead folded into the step overhead"
        )
        gbps = f"{self.effective_gbps:.1f} GB/s" if self.effective_gbps else "bandwidth term 0"
        gflops = f"{self.effective_gflops:.1f} GFLOP/s" if self.effective_gflops else "FLOP term 0"
        multi = (
            f", +{1 / self.s_per_byte_multirow / 1e9:.1f} GB/s-equivalent per byte when rows > 1"
            if self.s_per_byte_multirow > 0 and "s_per_byte_multirow" not in self.folded
            else ""
        )
        return (
            f"effective {shown('s_per_byte', gbps)}{multi}, "
            f"{shown('s_per_flop', gflops)}, "
            f"{shown('step_overhead_s', f'{self.step_overhead_s * 1e3:.2f} ms/step')}, {layer}; "
            f"held-out median |error| {pct(self.heldout_err_before_pct)} before (roofline bound) "
            f"-> {pct(self.heldout_err_after_pct)} after, on {self.n_heldout} held-out steps"
        )


def needed_points(layer_shapes: int) -> int:
    """How many measured points a fit needs: one per fitted parameter (the per-layer overhead only
    with two or more model shapes)."""
    return 4 if layer_shapes >= 2 else 3


def _check_points(points: list[dict]) -> None:
    for p in points:
        missing = [k for k in POINT_KEYS if k not in p]
        if missing:
            raise ValueError(f"a calibration point lacks {', '.join(missing)}: {p}")
        if not p["latency_s"] > 0:
            raise ValueError(f"a calibration point has no measured latency: {p}")


def _errors(values: list[float], truth: list[float]) -> list[float]:
    return [abs(v - t) / t * 100.0 for v, t in zip(values, truth, strict=True)]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _why_folded(term: str, reason: str) -> str:
    into = {
        "layer_overhead_s": "folded into step_overhead_s (the model shapes' layer counts do not "
        "separate it from the per-step and per-byte terms)",
        "s_per_byte_multirow": "folded into s_per_byte and s_per_flop (the grid does not separate "
        "the multi-row kernel's cost per byte from them)",
    }[term]
    return f"{into}: {reason}"


def _outlier_note(p: dict) -> str:
    return (
        f"left out of the fit: {p['model']} batch {p['batch']} context {p['context_len']} measured "
        f"{p['latency_s'] * 1e3:.1f} ms, over {100 * rule_.OUTLIER_LIMIT:.0f}% above the fit "
        "to the other steps, and marked noisy (another process slowed it)"
    )


def _prefold(terms: tuple[str, ...], train: list[dict]) -> dict[str, str]:
    """Terms no grid like this one could determine: one model shape (no per-layer term), only
    one-row or only multi-row steps (no multi-row term)."""
    out = {}
    if len({p["layers"] for p in train}) < 2:
        out["layer_overhead_s"] = (
            "one model shape: the per-layer overhead is folded into the per-step overhead; fit two "
            "model shapes to separate them"
        )
    if "s_per_byte_multirow" in terms and len({rule_.rows(p) > 1 for p in train}) < 2:
        out["s_per_byte_multirow"] = _why_folded(
            "s_per_byte_multirow", "the fit needs both one-row and multi-row steps"
        )
    return out


def fit(
    train: list[dict],
    heldout: list[dict] | None = None,
    *,
    device: str = "",
    dtype: str = "",
    threads: int | None = None,
    rule: str = "linear",
) -> Calibration:
    """Fit a rule (calibrate_rule.RULES: "linear", "gemm") to the `train` points and report the
    errors on `heldout` (both lists of point dicts, POINT_KEYS; optional "rows"). Coefficients the
    grid does not determine are folded (Calibration.folded, calibrate_rule.identify). Raises
    TooFewPoints naming how many points it needs."""
    train, heldout = list(train), list(heldout or [])
    _check_points(train + heldout)
    device = device or str(train[0].get("device", "")) if train else device
    dtype = dtype or str(train[0].get("dtype", "")) if train else dtype
    need = needed_points(len({p["layers"] for p in train}))
    if len(train) < need:
        raise TooFewPoints(
            f"calibration needs at least {need} measured steps to fit "
            f"{'4 parameters' if need == 4 else '3 parameters (one model shape)'}, got {len(train)}"
            "; measure more batch sizes or context lengths (explorer sweep regime-map)"
        )
    prefolded = _prefold(rule_.TERMS[rule], train)
    terms = tuple(t for t in rule_.TERMS[rule] if t not in prefolded)
    slowed = rule_.outliers(terms, train, keep=max(need, len(terms) + 1))
    outliers = [p for i, p in enumerate(train) if i in slowed]
    train = [p for i, p in enumerate(train) if i not in slowed]
    x, folded, ident = rule_.identify(terms, train, _why_folded)
    folded = prefolded | folded
    notes = [f"{name}: {why}" for name, why in folded.items()] + [
        _outlier_note(p) for p in outliers
    ]
    notes += [f"{t} fitted as 0 (that term explains none of these steps)" for t in x if x[t] == 0]
    cal = Calibration(
        s_per_byte=x.get("s_per_byte", 0.0),
        s_per_flop=x.get("s_per_flop", 0.0),
        step_overhead_s=x.get("step_overhead_s", 0.0),
        layer_overhead_s=x.get("layer_overhead_s"),
        s_per_byte_multirow=x.get("s_per_byte_multirow", 0.0),
        models=sorted({p["model"] for p in train}),
        device=device,
        dtype=dtype,
        threads=threads,
        rule=rule_.RULES[rule],
        n_train=len(train),
        n_heldout=len(heldout),
        notes=notes,
        folded=folded,
        identifiability=ident,
    )
    cal.train_err_pct = _median(
        _errors([cal.predict_point(p) for p in train], [p["latency_s"] for p in train])
    )
    _score(cal, heldout)
    splits = (("train", train), ("heldout", heldout), ("outlier", outliers))
    cal.points = [p | {"split": name} for name, mine in splits for p in mine]
    return cal


def _score(cal: Calibration, heldout: list[dict]) -> None:
    """Fill the held-out errors (all points, and per model) before and after."""

    def errors(points):
        truth = [p["latency_s"] for p in points]
        before = _errors([p["bound_s"] for p in points], truth)
        after = _errors([cal.predict_point(p) for p in points], truth)
        return before, after

    before, after = errors(heldout)
    cal.heldout_err_before_pct, cal.heldout_err_after_pct = _median(before), _median(after)
    for model in sorted({p["model"] for p in heldout}):
        mine = [p for p in heldout if p["model"] == model]
        b, a = errors(mine)
        cal.per_model[model] = {
            "n_heldout": len(mine),
            "heldout_err_before_pct": _median(b),
            "heldout_err_after_pct": _median(a),
            "points": [
                {
                    "batch": p["batch"],
                    "context_len": p["context_len"],
                    "latency_s": p["latency_s"],
                    "bound_s": p["bound_s"],
                    "predicted_s": cal.predict_point(p),
                }
                for p in mine
            ],
        }


def split_points(points: list[dict]) -> tuple[list[dict], list[dict]]:
    """The default train / held-out split of a grid of points, per model: train on the smallest
    context at every batch size plus batch 1 at the largest context; hold out every other cell
    (so the held-out steps have other context lengths and batch sizes than most of the fit)."""
    train, heldout = [], []
    for model in sorted({p["model"] for p in points}):
        mine = [p for p in points if p["model"] == model]
        contexts = sorted({p["context_len"] for p in mine})
        batches = sorted({p["batch"] for p in mine})
        for p in mine:
            pick = p["context_len"] == contexts[0] or (
                p["batch"] == batches[0] and p["context_len"] == contexts[-1]
            )
            (train if pick else heldout).append(p)
    return train, heldout


# --- the calibration predictions use -------------------------------------------------------------


def use(cal: Calibration | dict | None, model: str | None = None) -> None:
    """Make `cal` the calibration that predictions in this process use for its models (or for
    `model`); None forgets them."""
    if cal is None:
        for key in [k for k in _ACTIVE if model is None or k[0] == model]:
            del _ACTIVE[key]
        return
    if isinstance(cal, dict):
        cal = Calibration.from_dict(cal)
    for name in [model] if model else cal.models:
        _ACTIVE[(name, cal.device, cal.dtype)] = cal


def active(model: str, device: str, dtype: str) -> Calibration | None:
    """The calibration in use for this model on this device and dtype, if any."""
    return _ACTIVE.get((model, str(device), str(dtype)))
