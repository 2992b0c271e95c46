"""Steady state, or say it is not: one trend test for measured and simulated serving runs.

A request rate is a steady-state claim. Past the engine's capacity the waiting queue grows for as
long as requests keep arriving, so a run's throughput and percentiles depend on how long it was.
The test (pure python, no UI), from the per-request records alone (arrival and first-token times),
so a measured run (any engine, over http too) and a simulated one are judged the same way:

    waiting(t) = requests arrived by t that have no first token yet      (the waiting queue)
    slope      = least-squares slope of waiting(t_i) against t_i at each arrival t_i in the second
                 half of the arrival window (the first half is the queue filling from empty)
    growth     = slope / the arrival rate over that half                 (dimensionless)
    steady     = growth <= GROWTH_LIMIT, and every request produced a token

Why this, and why 0.05: arrivals above the service rate (lambda > mu) pile up at lambda - mu
requests/s, so growth = 1 - mu / lambda = 1 - 1 / rho: the share of arrivals that join a queue
that never drains. A stable queue wanders but does not trend (growth about 0; it is noisier in
short runs, about +-0.03 for 200 requests near saturation). The limit 0.05 flags arrivals more
than about 5% above what the engine drains; a smaller overload still grows the queue, which the
SLOs of a run long enough for its p99s to settle then catch.

    utilization = offered request rate / modelled service capacity (req/s)

The capacity of a simulated engine is its step model's saturation rate
(explorer.serving.simulate.run.saturation_rate); a measured run has none (None). A run with all
requests at once (a burst) or a closed loop has no arrival rate to be steady at: steady is None.
"""

from __future__ import annotations

import bisect

GROWTH_LIMIT = 0.05  # waiting-queue growth per arrival (= 1 - 1 / rho when overloaded)
MIN_POINTS = 8  # fewer requests in the second half: too few to judge (steady None)


def waiting_points(records) -> list[tuple[float, int]]:
    """(t, waiting queue length just after t) at every arrival t, in arrival order."""
    arrivals = sorted(r.arrival_s for r in records)
    firsts = sorted(r.token_s[0] for r in records if r.token_s)
    return [(t, i + 1 - bisect.bisect_right(firsts, t)) for i, t in enumerate(arrivals)]


def slope(points) -> float:
    """Least-squares slope of y on x (0 when x does not vary)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def queue_growth(records) -> float | None:
    """The waiting queue's growth over the second half of the arrivals, per arrival (see the
    module docstring); None when the arrivals do not spread over time or too few arrive late."""
    pts = waiting_points(records)
    if not pts or pts[-1][0] <= pts[0][0]:
        return None
    late = [p for p in pts if p[0] >= (pts[0][0] + pts[-1][0]) / 2]
    if len(late) < MIN_POINTS or late[-1][0] <= late[0][0]:
        return None
    rate = (len(late) - 1) / (late[-1][0] - late[0][0])
    return slope(late) / rate


def judge(records, capacity_rps: float | None = None, offered_rps: float | None = None) -> dict:
    """steady (True / False / None), the delay slope, utilization and a one-line verdict.

    offered_rps: the workload's request rate (default: requests / arrival span, if they spread);
    capacity_rps: the modelled service capacity (None for a measured run)."""
    growth = queue_growth(records)
    unfinished = sum(1 for r in records if r.end_s is None)
    if offered_rps is None:
        offered_rps = offered_rate(records)
    utilization = offered_rps / capacity_rps if offered_rps and capacity_rps else None
    if growth is None:
        steady = None
        why = "no arrival rate to be steady at (requests at once, or too few spread over time)"
    else:
        steady = growth <= GROWTH_LIMIT and unfinished == 0
        why = (
            f"steady: the waiting queue grows by {growth:+.3f} per arrival over the second half "
            f"(limit {GROWTH_LIMIT})"
            if steady
            else unstable_line(capacity_rps, growth, utilization)
        )
    return {
        "steady": steady,
        "queue_growth": growth,
        "utilization": utilization,
        "capacity_rps_modelled": capacity_rps,
        "stability": why,
    }


def unstable_line(
    capacity_rps: float | None, growth: float | None = None, utilization: float | None = None
) -> str:
    """The one line an unstable run carries (the modelled capacity is a fluid estimate: a queue
    may grow a little below it, and then the line says so)."""
    trend = (
        f" (the waiting queue grows by {growth:+.3f} per arrival; limit {GROWTH_LIMIT})"
        if growth is not None
        else ""
    )
    if capacity_rps and (utilization is None or utilization >= 1):
        return f"unstable: arrivals exceed the modelled capacity of {capacity_rps:.3g} req/s{trend}"
    if capacity_rps:
        return (
            f"unstable: arrivals exceed what the simulated engine drains, {utilization:.0%} of "
            f"the modelled capacity of {capacity_rps:.3g} req/s{trend}"
        )
    return f"unstable: arrivals exceed what the engine drains{trend}"


def offered_rate(records) -> float | None:
    """Requests / arrival span (req/s): the offered load of a run whose arrivals spread."""
    arrivals = sorted(r.arrival_s for r in records)
    if len(arrivals) < 2 or arrivals[-1] <= arrivals[0]:
        return None
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
