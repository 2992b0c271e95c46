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

Three verdicts (steadiness), from the shape of the backlog, the same for every run:

    overloaded  growth > GROWTH_LIMIT (the queue keeps a share of the arrivals: it grows in
                proportion to time), or a request never produced a token
    backlogged  not overloaded, but the peak of waiting(t) over the second half exceeds
                BACKLOG_Z x sqrt(arrivals in that half) (a run of at least 2 x MIN_BACKLOG_POINTS
                requests): the queue grows like a random walk, as it does at capacity
    stable      neither; steady = (stable), None when there is no rate to judge

Why both: arrivals above the service rate (lambda > mu) pile up at lambda - mu requests/s, so
growth = 1 - mu / lambda = 1 - 1 / rho, the share of arrivals that join a queue that never
drains; 0.05 flags arrivals more than about 5% above what the engine drains. But exactly at
capacity (rho = 1) the backlog grows like sqrt(t), so a least-squares slope per arrival tends to
0 and reads "fine" there, and at 5% over capacity it is a few per cent, within a short run's
wander. A stable queue's backlog is stationary: its peak over n arrivals grows like log n, far
below sqrt(n); a queue at or past capacity reaches the order of sqrt(n) and more. The limits
were calibrated on simulated runs of known load (explorer.serving.simulate.saturation:
`python -m explorer.serving.simulate.saturation` prints the false-alarm rate at 0.8 of the
measured drain rate and the miss rate at 1.05, per run length). The waiting queue counts requests
in their prefill too, so a stable queue's level is about rate x TTFT: with the what-if's fitted
per-step and per-layer overheads (a 135M shape's step on an L4 is ~6 ms, most of it fixed) that
level reached 0.6-1.05 x sqrt(n) at 0.8 load, and the first limit (0.7, calibrated before those
overheads) read 83% of 1,000-request runs at 0.8 as backlogged. 1.2 separates them again: on
the 135M shape on an L4 (256 in / 16 out), 0.8 load peaked at 0.35-1.05 x sqrt(n) and 1.05 load
at 1.51-6.06 over 1,000-, 2,000- and 8,000-request runs (6, 6 and 3 seeds); the calibration
command's figures are in the README. Runs shorter than
2 x MIN_BACKLOG_POINTS are judged by the slope alone (a short stable run's peak is of the order
of sqrt(n) already).

    utilization = offered request rate / modelled service capacity (req/s)

The capacity of a simulated engine is its step model's saturation rate
(explorer.serving.simulate.run.saturation_rate); a measured run has none (None). A run with all
requests at once (a burst) or a closed loop has no arrival rate to be steady at: steady is None.
"""

from __future__ import annotations

import bisect

GROWTH_LIMIT = 0.05  # waiting-queue growth per arrival (= 1 - 1 / rho when overloaded)
MIN_POINTS = 8  # fewer requests in the second half: too few to judge (steady None)
BACKLOG_Z = 1.2  # backlogged: peak late backlog > BACKLOG_Z x sqrt(late arrivals)
MIN_BACKLOG_POINTS = 250  # late arrivals the backlog test needs (runs of 500+ requests)
VERDICTS = ("stable", "backlogged", "overloaded")


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


def late_points(records) -> list[tuple[float, int]] | None:
    """waiting_points over the second half of the arrival window; None when the arrivals do not
    spread over time or too few arrive late."""
    pts = waiting_points(records)
    if not pts or pts[-1][0] <= pts[0][0]:
        return None
    late = [p for p in pts if p[0] >= (pts[0][0] + pts[-1][0]) / 2]
    if len(late) < MIN_POINTS or late[-1][0] <= late[0][0]:
        return None
    return late


def queue_growth(records) -> float | None:
    """The waiting queue's growth over the second half of the arrivals, per arrival (see the
    module docstring); None when the arrivals do not spread over time or too few arrive late."""
    late = late_points(records)
    return None if late is None else _growth(late)


def _growth(late) -> float:
    rate = (len(late) - 1) / (late[-1][0] - late[0][0])
    return slope(late) / rate


def backlog_z(late) -> float | None:
    """The late half's peak backlog / sqrt(its arrivals); None below MIN_BACKLOG_POINTS."""
    if late is None or len(late) < MIN_BACKLOG_POINTS:
        return None
    return max(b for _, b in late) / len(late) ** 0.5


def steadiness(records) -> tuple[str | None, float | None, float | None]:
    """(verdict: one of VERDICTS or None, growth per arrival, backlog z), as the module
    docstring says; the one test for measured and simulated runs."""
    late = late_points(records)
    if late is None:
        return None, None, None
    growth, z = _growth(late), backlog_z(late)
    if growth > GROWTH_LIMIT or any(r.end_s is None for r in records):
        return "overloaded", growth, z
    if z is not None and z > BACKLOG_Z:
        return "backlogged", growth, z
    return "stable", growth, z


def judge(records, capacity_rps: float | None = None, offered_rps: float | None = None) -> dict:
    """steadiness (stable / backlogged / overloaded / None), steady (stable: True), the queue's
    growth and backlog z, utilization and a one-line verdict.

    offered_rps: the workload's request rate (default: requests / arrival span, if they spread);
    capacity_rps: the modelled service capacity (None for a measured run)."""
    verdict, growth, z = steadiness(records)
    if offered_rps is None:
        offered_rps = offered_rate(records)
    utilization = offered_rps / capacity_rps if offered_rps and capacity_rps else None
    if verdict is None:
        why = "no arrival rate to be steady at (requests at once, or too few spread over time)"
    elif verdict == "stable":
        peak = "" if z is None else f"; its late peak {z:.2f} x sqrt(arrivals) (limit {BACKLOG_Z})"
        why = (
            f"steady: the waiting queue grows by {growth:+.3f} per arrival over the second half "
            f"(limit {GROWTH_LIMIT}){peak}"
        )
    elif verdict == "backlogged":
        why = (
            f"backlogged: the waiting queue's late peak reached {z:.2f} x sqrt(arrivals) (limit "
            f"{BACKLOG_Z}): it grows like a queue at capacity"
            + ("" if utilization is None else f" ({utilization:.0%} of the modelled capacity)")
        )
    else:
        why = unstable_line(capacity_rps, growth, utilization)
    return {
        "steady": None if verdict is None else verdict == "stable",
        "steadiness": verdict,
        "queue_growth": growth,
        "backlog_z": z,
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
