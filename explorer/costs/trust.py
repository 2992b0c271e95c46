"""The trust table: every prediction the explorer makes beside the measurement, with its error.

    trust(trace)                                   # roofline bound (and calibrated latency) per step
    trust(trace, speculative=rows, batch=df)       # + speculative speedup per k, + the batch knee

One row per prediction and group: {"prediction", "group" (phase / regime, or k), "n",
"predicted", "measured", "err_pct" (median of (predicted - measured) / measured x 100 over the
group, signed: negative = the prediction is optimistic), "abs_err_pct" (median |error|),
"unit", "basis" (the formula or method)}. Plain data, no model needed: a saved trace gives the
same table.
"""

from __future__ import annotations

import statistics
from typing import Any

from explorer.costs.calibrate import Calibration
from explorer.costs.parts import bound_bytes

BOUND_BASIS = "modelled: max(FLOPs / peak FLOP/s, bytes / peak bandwidth), measured peaks"
SPEC_BASIS = "modelled: Leviathan et al. eq. 1 with the measured alpha and c = draft / target pass"
KNEE_BASIS = "modelled: roofline knee (explorer.costs.decode_knee) vs the measured 2x-latency batch"


def _row(prediction, group, pairs, unit, basis) -> dict[str, Any] | None:
    pairs = [(p, m) for p, m in pairs if p is not None and m]
    if not pairs:
        return None
    errs = [(p - m) / m * 100.0 for p, m in pairs]
    return {
        "prediction": prediction,
        "group": group,
        "n": len(pairs),
        "predicted": statistics.median(p for p, _ in pairs),
        "measured": statistics.median(m for _, m in pairs),
        "err_pct": statistics.median(errs),
        "abs_err_pct": statistics.median(abs(e) for e in errs),
        "unit": unit,
        "basis": basis,
    }


def _layers(trace) -> int | None:
    info = getattr(trace, "model", None) or {}
    return info.get("layers") if isinstance(info, dict) else getattr(info, "layers", None)


def trust(
    trace=None,
    *,
    calibration: Calibration | dict | None = None,
    speculative: list[dict] | None = None,
    batch=None,
) -> list[dict[str, Any]]:
    """The trust table (module doc). trace: a Trace whose steps carry bound_s and latency_s;
    calibration: defaults to trace.calibration; speculative: explorer.bench.speculative.benchmark
    rows; batch: a batch sweep frame (its attrs carry both knees)."""
    rows: list[dict | None] = [] if trace is None else _step_rows(trace, calibration)
    for r in speculative or []:
        rows.append(
            _row(
                "speculative speedup",
                f"k={r['k']}",
                [(r.get("predicted"), r.get("measured"))],
                "x",
                SPEC_BASIS,
            )
        )
    if batch is not None:
        a = batch.attrs
        rows.append(
            _row(
                "batch knee",
                f"context {a.get('context_len')}",
                [(a.get("knee_batch_modelled"), a.get("knee_batch_measured"))],
                "batch",
                KNEE_BASIS,
            )
        )
    return [r for r in rows if r is not None]


def _step_rows(trace, calibration) -> list[dict | None]:
    """The trace's rows: per phase / regime, the step latencies against the roofline bound, then
    (with a calibration and the layer count) against the calibrated prediction."""
    rows: list[dict | None] = []
    steps = [s for s in trace.steps if s.latency_s and s.bound_s]
    groups: dict[str, list] = {}
    for s in steps:
        groups.setdefault(f"{s.phase} / {s.regime or '?'}", []).append(s)
    for group, mine in sorted(groups.items()):
        rows.append(
            _row(
                "step latency = roofline bound",
                group,
                [(s.bound_s, s.latency_s) for s in mine],
                "s",
                BOUND_BASIS,
            )
        )
    cal = calibration if calibration is not None else getattr(trace, "calibration", None)
    if isinstance(cal, dict):
        cal = Calibration.from_dict(cal)
    layers = _layers(trace)
    if cal is not None and layers:
        for group, mine in sorted(groups.items()):
            pairs = [
                (
                    cal.predict(
                        bytes=bound_bytes(s.bytes),
                        flops=s.flops,
                        layers=layers,
                        rows=s.batch_size * s.tokens_fed,
                    ),
                    s.latency_s,
                )
                for s in mine
                if s.bytes and s.flops
            ]
            rows.append(_row("step latency, calibrated", group, pairs, "s", "fitted: " + cal.rule))
    return rows
