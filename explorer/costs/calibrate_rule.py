"""The calibration's rules and what a grid of measured steps can determine of them.

Two rules (explorer.costs.calibrate.fit(rule=...)), each a sum of physical terms with one
non-negative coefficient per term, fitted by non-negative least squares on the relative error:

  "linear" (LINEAR_RULE, the rule before "gemm"):
      bytes x s_per_byte + FLOPs x s_per_flop + step overhead + layers x per-layer overhead
  "gemm" (GEMM_RULE):
      the same + [rows > 1] x bytes x s_per_byte_multirow

Why the extra term: on a CPU a pass with one row per weight matrix (a batch-1 decode step) is a
matrix-vector product that streams the weights once; with two or more rows the BLAS library
switches to its matrix-matrix kernel, which first packs (copies) the weight panels into its
blocked layout: one more pass over the bytes, whose cost per byte the fit measures. Measured on
this project's 2-core CPU (arch:qwen2.5-0.5b, fp32, context 256): 0.15 s at batch 1, 0.32 s at
batch 2, 0.29 s at batch 4, 0.32 s at batch 8, 0.46 s at batch 16: the jump is at batch 2, and
from there the FLOPs term carries the growth; the linear rule puts a straight line through it.

Identifiability (identify()): a coefficient is reported only when the grid determines it: each
is refitted with every training point left out in turn, and its leave-one-out spread (the largest
relative change) must stay within IDENTIFY_LIMIT; the condition number of the scaled design is
kept too. A coefficient that fails is folded: the per-layer overhead into the per-step overhead
(None), the multi-row per-byte cost into the bytes and FLOPs terms (0), refitted without it; the
three core terms are kept for predictions but named as undetermined, never printed as numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

LINEAR_RULE = (
    "latency = bytes / effective bandwidth + FLOPs / effective FLOP/s + step overhead "
    "+ layers x per-layer overhead (non-negative least squares on relative error)"
)
GEMM_RULE = (
    "latency = bytes / effective bandwidth + [rows > 1] x bytes x multi-row cost per byte "
    "(a matrix-matrix kernel packs the weights first; one row is a matrix-vector product) "
    "+ FLOPs / effective FLOP/s + step overhead + layers x per-layer overhead "
    "(non-negative least squares on relative error)"
)
RULES = {"linear": LINEAR_RULE, "gemm": GEMM_RULE}
DEFAULT_RULE = "gemm"
TERMS = {
    "linear": ("s_per_byte", "s_per_flop", "step_overhead_s", "layer_overhead_s"),
    "gemm": (
        "s_per_byte",
        "s_per_byte_multirow",
        "s_per_flop",
        "step_overhead_s",
        "layer_overhead_s",
    ),
}
FOLDABLE = ("layer_overhead_s", "s_per_byte_multirow")  # tried in this order when undetermined
IDENTIFY_LIMIT = 0.25  # largest leave-one-out relative change of a reported coefficient
OUTLIER_LIMIT = 0.5  # a training step measured this much slower than the fit predicts: dropped


def rows(point: dict) -> int:
    """The rows of the pass's weight matrices: batch x tokens fed ("rows", else "batch")."""
    return int(point.get("rows", point["batch"]))


def column(term: str, point: dict) -> float:
    """The value the coefficient `term` multiplies for this point."""
    if term == "s_per_byte":
        return float(point["bytes"])
    if term == "s_per_byte_multirow":
        return float(point["bytes"]) if rows(point) > 1 else 0.0
    if term == "s_per_flop":
        return float(point["flops"])
    if term == "step_overhead_s":
        return 1.0
    if term == "layer_overhead_s":
        return float(point["layers"])
    raise ValueError(f"unknown calibration term {term!r}")


def nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 (a small active-set loop: few columns)."""
    active = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))  # drop the most negative term and refit
    return x


def _design(terms, points) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The relative-error design (each row over its latency, each column scaled to max 1)."""
    A = np.array([[column(t, p) for t in terms] for p in points], dtype=float)
    t = np.array([p["latency_s"] for p in points], dtype=float)
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    return (A / scale) / t[:, None], np.ones_like(t), scale


def solve(terms, points) -> dict[str, float]:
    """The coefficients of `terms` fitted to `points` (relative error, non-negative)."""
    A, y, scale = _design(terms, points)
    return dict(zip(terms, (nnls(A, y) / scale).tolist(), strict=True))


def condition(terms, points) -> float:
    """The condition number of the scaled design: large when terms can stand in for each other."""
    A, _, _ = _design(terms, points)
    return float(np.linalg.cond(A))


def loo_spread(terms, points, fitted: dict[str, float]) -> dict[str, float | None]:
    """Per coefficient, the largest relative change when one training point is left out (None:
    fitted as 0, or too few points to leave one out)."""
    if len(points) <= len(terms):
        return {t: None for t in terms}
    worst = dict.fromkeys(terms, 0.0)
    for i in range(len(points)):
        again = solve(terms, points[:i] + points[i + 1 :])
        for t in terms:
            if fitted[t] > 0:
                worst[t] = max(worst[t], abs(again[t] - fitted[t]) / fitted[t])
    return {t: (worst[t] if fitted[t] > 0 else None) for t in terms}


def outliers(terms, points: list[dict], keep: int) -> list[int]:
    """Training steps another process slowed: marked noisy while measured (point["noisy"], from
    explorer.costs.noise) and measured more than OUTLIER_LIMIT above what the fit to the others
    predicts (interference only ever adds time), worst first, at most a quarter of the points and
    never below `keep` points; refitted after each drop. Unmarked steps are never dropped."""
    dropped: list[int] = []
    while len(points) - len(dropped) > keep and len(dropped) < len(points) // 4:
        rest = [i for i in range(len(points)) if i not in dropped]
        fitted = solve(terms, [points[i] for i in rest])
        over = {
            i: points[i]["latency_s"]
            / max(sum(fitted[t] * column(t, points[i]) for t in terms), 1e-12)
            for i in rest
        }
        marked = [i for i in over if points[i].get("noisy")]
        worst = max(marked, key=over.get) if marked else None
        if worst is None or over[worst] <= 1 + OUTLIER_LIMIT:
            break
        dropped.append(worst)
    return dropped


def identify(
    terms: tuple[str, ...], points: list[dict], why_folded: Callable[[str, str], str]
) -> tuple[dict[str, float], dict[str, str], dict]:
    """Fit `terms`, folding undetermined foldable ones (FOLDABLE order) until the rest are
    determined or none is left to fold. Returns (coefficients, folded {term: why}, identifiability
    {"condition", "loo_spread", "limit"}); why_folded(term, reason) words a fold."""
    terms, folded = list(terms), {}
    while True:
        fitted = solve(terms, points)
        spread = loo_spread(terms, points, fitted)
        bad = [
            t
            for t in FOLDABLE
            if t in terms and (fitted[t] == 0 or (spread[t] or 0) > IDENTIFY_LIMIT)
        ]
        if not bad:
            break
        term = bad[0]
        reason = (
            "fitted as 0"
            if fitted[term] == 0
            else f"leave-one-out spread {100 * spread[term]:.0f}% > {100 * IDENTIFY_LIMIT:.0f}%"
        )
        folded[term] = why_folded(term, reason)
        terms.remove(term)
    for t in terms:
        if spread[t] is not None and spread[t] > IDENTIFY_LIMIT:
            folded[t] = (
                f"not determined by this grid (leave-one-out spread {100 * spread[t]:.0f}% > "
                f"{100 * IDENTIFY_LIMIT:.0f}%): kept for predictions, not reported as a fit"
            )
    info = {
        "condition": condition(terms, points),
        "loo_spread": spread,
        "limit": IDENTIFY_LIMIT,
    }
    return fitted, folded, info
