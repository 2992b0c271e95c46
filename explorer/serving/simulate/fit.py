"""The what-if's fitted settings: how they are fitted to published runs, split by source.

Moved out of explorer.serving.simulate.published (which replays the runs and reports the
errors); `explorer bench simulate --published --fit` runs fit() on the runs of
published.FIT_SOURCES only (split by source, never by point: two runs of one source share an
engine, a harness and a lab). The search: bandwidth and FLOP efficiency and the per-iteration
overhead by coordinate descent on the median |log(simulated / measured)| of the throughputs,
TPOT, ITL and E2E latency, then the per-request latency outside the engine (an added constant,
so no new simulation) on TTFT.
"""

from __future__ import annotations

import math
import statistics

from explorer.serving.simulate.published import FIT_SOURCES, METRICS, _at_most, compare_all

FIT_AT_MOST = 400  # requests per run simulated while fitting (the table simulates all of them)
FIT_TOKENS = 60_000  # and output tokens per run while fitting
FIT_SEARCH = {  # setting: (lowest, highest) the coordinate descent searches
    "bw_efficiency": (0.3, 1.0),
    "flop_efficiency": (0.2, 1.0),
    "iteration_overhead_s": (0.0, 8e-3),
}


def _log_error(rows: list[dict], metrics) -> float:
    """Mean |log(simulated / measured)| over the rows of these metrics (a missing simulation
    counts as a factor of e)."""
    errs = [
        abs(math.log(r["simulated"] / r["measured"])) if r["simulated"] else 1.0
        for r in rows
        if r["metric"] in metrics and r["measured"]
    ]
    return statistics.fmean(errs) if errs else 0.0


def fit(
    points: list[dict], rounds: int = 2, steps: int = 5, progress=None, at_most: int = FIT_AT_MOST
) -> dict:
    """The what-if settings that best match the points (see the module docstring); each point is
    simulated with at most `at_most` of its requests while searching, to keep the fit minutes."""
    from explorer.serving.simulate.whatif import DEFAULTS

    if not points:
        raise ValueError(
            f"--fit: no published run of the fitted sources ({', '.join(FIT_SOURCES)}) to fit on"
        )
    best = {k: DEFAULTS[k] for k in FIT_SEARCH}
    speed = [m for m in METRICS if m != "median_ttft_ms"]
    points = [_at_most(p, at_most, FIT_TOKENS) for p in points]

    def loss(settings: dict) -> float:
        return _log_error(compare_all(points, {**settings, "request_latency_s": 0.0}), speed)

    score = loss(best)
    for r in range(rounds):
        for name, (low, high) in FIT_SEARCH.items():
            width = (high - low) / (2 ** (r + 1))
            grid = [
                best[name] + width * (i / (steps // 2))
                for i in range(-(steps // 2), steps // 2 + 1)
            ]
            for value in sorted({min(high, max(low, v)) for v in grid} - {best[name]}):
                if name.endswith("efficiency") and value <= 0:
                    continue
                trial = {**best, name: value}
                s = loss(trial)
                if progress:
                    progress(f"{name}={value:.4g}: mean |log error| {s:.4f}")
                if s < score:
                    best, score = trial, s
    rows = compare_all(points, {**best, "request_latency_s": 0.0})
    best["request_latency_s"] = fit_latency(rows)
    return best


def fit_latency(rows: list[dict]) -> float:
    """The per-request latency (s) that minimises the mean |log error| of TTFT (grid, 1 ms)."""
    ttft = [r for r in rows if r["metric"] == "median_ttft_ms" and r["simulated"]]
    if not ttft:
        return 0.0

    def err(ms: float) -> float:
        return statistics.fmean(abs(math.log((r["simulated"] + ms) / r["measured"])) for r in ttft)

    return min(range(0, 201), key=err) / 1e3
