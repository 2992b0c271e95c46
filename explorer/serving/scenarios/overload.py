"""overload: past the knee the waiting queue grows without bound and TTFT climbs with time.

Calibration first (measured: a burst through the same engine gives the requests/s it drains;
modelled: the step model's saturation rate), then Poisson arrivals at OVERLOAD x that rate
(broken), and the fix: capacity, REPLICAS replicas sharing the same arrivals, each seeing
1 / REPLICAS of the rate (one replica measured: as many requests at 1 / REPLICAS of the rate).
The verdict is explorer.serving.steady's trend test on the broken run's records, the TTFT of its
last quarter of requests against its first quarter, and what its first SHORT requests alone
(a short benchmark at the same rate) would have shown.
"""

from __future__ import annotations

import math

from explorer.serving.metrics import summarise
from explorer.serving.scenarios import Plan, Scenario, register
from explorer.serving.scenarios._figures import headline, ms, percentile_ms, ratio, times
from explorer.serving.steady import judge
from explorer.serving.workload import Workload

OVERLOAD = 3.0  # the broken run's rate / the calibrated capacity
TARGET_LOAD = 0.6  # each replica's share of the capacity after the fix (at most)
SHORT = 24  # the short benchmark the broken run's first requests stand for
LOCAL = {"input_len": 16, "output_len": 8, "num_prompts": 48}
CALIBRATION = 32  # requests of the burst that measures what the engine drains
MODELLED = {"input_len": 512, "output_len": 128, "num_prompts": 600}


def replicas_needed(overload: float = OVERLOAD, target: float = TARGET_LOAD) -> int:
    return math.ceil(overload / target)


@register
class Overload(Scenario):
    name, order = "overload", 10
    title = "overload: past the knee the queue grows without bound"
    needs = ()  # any engine: only the arrival rate changes
    fix = f"capacity: {replicas_needed()} replicas share the arrivals"
    why = (
        "Requests arrive faster than the engine drains them, so the waiting queue grows for as "
        "long as they keep coming and every request waits longer than the one before. "
        "A short benchmark at the same rate ends before the queue is long, so its percentiles "
        "look healthy and its throughput looks like a rate the engine sustains; a longer run "
        "diverges, and the trend test calls it unstable. "
        "The fix is capacity (more replicas, or admission control that refuses what cannot be "
        "served): each replica then sees a rate below what it drains and the queue stays bounded."
    )

    def sizes(self, ctx) -> dict:
        return MODELLED if ctx.modelled else LOCAL

    def prepare(self, ctx) -> None:
        s = self.sizes(ctx)
        if ctx.modelled:
            cap = ctx.capacity_rps(s["input_len"], s["output_len"])
            ctx.notes.update(capacity_rps=cap, capacity_from="modelled saturation rate")
            return
        calib = Workload(
            num_prompts=CALIBRATION, input_len=s["input_len"], output_len=s["output_len"]
        )
        res = ctx.serve(Plan("calibration (burst)", calib, ctx.engine))
        ctx.results.remove(res)  # not one of the scenario's two runs
        cap = res.result["request_throughput"]
        ctx.notes.update(
            capacity_rps=cap, capacity_from=f"measured: a burst of {CALIBRATION} requests"
        )

    def workload(self, ctx, share: int) -> Workload:
        s, cap = self.sizes(ctx), self.notes_capacity(ctx)
        return Workload(
            num_prompts=s["num_prompts"],
            arrival="poisson",
            request_rate=OVERLOAD * cap / share,
            input_len=s["input_len"],
            output_len=s["output_len"],
            seed=0,
        )

    @staticmethod
    def notes_capacity(ctx) -> float:
        cap = ctx.notes.get("capacity_rps")
        if not cap:
            raise ValueError("overload: the calibration run drained nothing (stopped?)")
        return cap

    def broken(self, ctx) -> Plan:
        return Plan(f"{OVERLOAD}x capacity", self.workload(ctx, 1), ctx.engine)

    def fixed(self, ctx) -> Plan:
        n = replicas_needed()
        return Plan(f"1 of {n} replicas", self.workload(ctx, n), ctx.engine)

    def evidence(self, broken, fixed, notes) -> dict:
        recs = sorted(broken.records, key=lambda r: r.arrival_s)
        q = max(1, len(recs) // 4)
        first = [r.ttft for r in recs[:q] if r.ttft is not None]
        last = [r.ttft for r in recs[-q:] if r.ttft is not None]
        short = recs[:SHORT]
        cap = notes.get("capacity_rps")
        judged = judge(recs)
        ev = {
            "capacity_rps": cap,
            "capacity_from": notes.get("capacity_from"),
            "offered_rps": broken.workload.get("request_rate"),
            "replicas": replicas_needed(),
            "queue_growth": judged["queue_growth"],
            "steady": judged["steady"],
            "stability": judged["stability"],
            "median_ttft_first_quarter_ms": percentile_ms(first, 50),
            "median_ttft_last_quarter_ms": percentile_ms(last, 50),
            "short_run_requests": len(short),
            "short_run_p99_ttft_ms": summarise(short)["p99_ttft_ms"],
            "fixed_steady": judge(fixed.records)["steady"],
            "broken": headline(broken),
            "fixed": headline(fixed),
        }
        ev["ttft_climb"] = ratio(
            ev["median_ttft_last_quarter_ms"], ev["median_ttft_first_quarter_ms"]
        )
        return ev

    def verdict(self, ev: dict) -> str:
        state = {True: "steady", False: "unstable", None: "not judged"}
        growth = ev["queue_growth"]
        trend = "n/a" if growth is None else f"{growth:+.2f}"
        return (
            f"{state[ev['steady']]} at {OVERLOAD}x capacity: the waiting queue grows by {trend} "
            f"per arrival and median TTFT climbs {times(ev['ttft_climb'])} from the first quarter "
            f"of requests to the last (the first {ev['short_run_requests']} alone: p99 TTFT "
            f"{ms(ev['short_run_p99_ttft_ms'])}, against {ms(ev['broken']['p99_ttft_ms'])} for "
            f"the whole run); {ev['replicas']} replicas: {state[ev['fixed_steady']]}, p99 TTFT "
            f"{ms(ev['fixed']['p99_ttft_ms'])}"
        )
