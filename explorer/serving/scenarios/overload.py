"""overload: past the knee the waiting queue grows without bound and TTFT climbs with time.

Calibration first (measured: a throwaway warm-up burst, so the engine's cold first passes are
left out, then a burst through the same engine: requests / its duration is the rate it drained;
modelled: the step model's saturation rate), then Poisson arrivals at OVERLOAD x that rate
(broken), and the fix: capacity, replicas sharing the same arrivals, as many as it takes for each
to see at most TARGET_LOAD of that rate (one replica measured, with more requests: a steady
queue wanders, and the trend test needs a longer run to tell wandering from growth).
The verdict is explorer.serving.steady's trend test on the broken run's records, the TTFT of its
last quarter of requests against its first quarter, and what its first SHORT requests alone
(a short benchmark at the same rate) would have shown.
"""

from __future__ import annotations

import math

from explorer._format import ms_value, number, times
from explorer.serving.metrics import summarise
from explorer.serving.scenarios import Scenario, ScenarioRun, register
from explorer.serving.scenarios._figures import headline, percentile_ms, ratio
from explorer.serving.steady import judge
from explorer.serving.workload import Workload

OVERLOAD = 3.0  # the broken run's rate / the calibrated capacity
TARGET_LOAD = 0.5  # each replica's share of the capacity after the fix (at most)
SHORT = 24  # the short benchmark the broken run's first requests stand for
WARMUP = 4  # requests of the throwaway burst before the calibration (a cold first pass is slow)
# num_prompts: the broken run (at OVERLOAD x: the trend test needs MIN_POINTS in its second half);
# fixed_prompts: the one replica's run (a steady queue wanders: the trend test needs more of it to
# tell wandering from growth); calibration: the burst that measures what the engine drains
LOCAL = {
    "input_len": 16,
    "output_len": 8,
    "num_prompts": 96,
    "fixed_prompts": 128,
    "calibration": 48,
}
SMALL = {
    "input_len": 16,
    "output_len": 8,
    "num_prompts": 64,
    "fixed_prompts": 96,
    "calibration": 32,
}
MODELLED = {
    "input_len": 512,
    "output_len": 128,
    "num_prompts": 600,
    "fixed_prompts": 600,
    "calibration": 0,
}


def replicas_needed(offered: float, capacity: float, target: float = TARGET_LOAD) -> int:
    """Replicas sharing `offered` req/s so that each sees at most `target` of `capacity`."""
    return max(1, math.ceil(offered / (target * capacity) - 1e-9))


@register
class Overload(Scenario):
    name, order = "overload", 10
    title = "overload: past the knee the queue grows without bound"
    needs = ()  # any engine: only the arrival rate changes
    fix = f"capacity: replicas enough that each sees at most {TARGET_LOAD:.0%} of what it drains"
    why = (
        "Requests arrive faster than the engine drains them, so the waiting queue grows for as "
        "long as they keep coming and every request waits longer than the one before. "
        "A short benchmark at the same rate ends before the queue is long, so its percentiles "
        "look healthy and its throughput looks like a rate the engine sustains; a longer run "
        "diverges, and the trend test calls it unstable. "
        "The fix is capacity (more replicas, or admission control that refuses what cannot be "
        "served): each replica then sees a rate below what it drains and the queue stays bounded."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": LOCAL, "modelled": MODELLED}

    def prepare(self, ctx) -> None:
        s = self.sizes(ctx)
        if ctx.modelled:
            cap = ctx.capacity_rps(s["input_len"], s["output_len"])
            ctx.notes.update(capacity_rps=cap, capacity_from="modelled saturation rate")
            return
        n, shape = s["calibration"], {"input_len": s["input_len"], "output_len": s["output_len"]}
        for label, count in (("warm-up", WARMUP), ("calibration (burst)", n)):
            wl = Workload(num_prompts=count, **shape, seed=1)
            res = ctx.serve(ScenarioRun(label, wl, ctx.engine), keep=False)
        ctx.notes.update(
            capacity_rps=res.result["request_throughput"],
            capacity_from=(
                f"measured: a burst of {n} requests after a warm-up burst of {WARMUP} (requests "
                "/ the burst's duration, the engine's first passes left out)"
            ),
        )

    def workload(self, ctx, rate: float, prompts: int) -> Workload:
        s = self.sizes(ctx)
        return Workload(
            num_prompts=prompts,
            arrival="poisson",
            request_rate=rate,
            input_len=s["input_len"],
            output_len=s["output_len"],
            seed=0,
        )

    @staticmethod
    def notes_capacity(ctx) -> float:
        cap = ctx.notes.get("capacity_rps")
        if not cap:
            raise ValueError("overload: the calibration burst drained nothing (stopped?)")
        return cap

    def broken(self, ctx) -> ScenarioRun:
        rate = OVERLOAD * self.notes_capacity(ctx)
        ctx.notes["offered_rps"] = rate
        wl = self.workload(ctx, rate, self.sizes(ctx)["num_prompts"])
        return ScenarioRun(f"{OVERLOAD}x capacity", wl, ctx.engine)

    def fixed(self, ctx) -> ScenarioRun:
        cap, offered = self.notes_capacity(ctx), ctx.notes["offered_rps"]
        n = replicas_needed(offered, cap)
        ctx.notes["replicas"] = n
        wl = self.workload(ctx, offered / n, self.sizes(ctx)["fixed_prompts"])
        return ScenarioRun(f"1 of {n} replicas", wl, ctx.engine)

    def evidence(self, broken, fixed, notes) -> dict:
        recs = sorted(broken.records, key=lambda r: r.arrival_s)
        q = max(1, len(recs) // 4)
        first = [r.ttft for r in recs[:q] if r.ttft is not None]
        last = [r.ttft for r in recs[-q:] if r.ttft is not None]
        short = recs[:SHORT]
        cap = notes.get("capacity_rps")
        judged = judged_run(broken)
        ev = {
            "capacity_rps": cap,
            "capacity_from": notes.get("capacity_from"),
            "offered_rps": broken.workload.get("request_rate"),
            "replicas": notes.get("replicas"),
            "fixed_offered_rps": fixed.workload.get("request_rate"),
            "fixed_load": ratio(fixed.workload.get("request_rate"), cap),
            "queue_growth": judged["queue_growth"],
            "steady": judged["steady"],
            "stability": judged["stability"],
            "median_ttft_first_quarter_ms": percentile_ms(first, 50),
            "median_ttft_last_quarter_ms": percentile_ms(last, 50),
            "short_run_requests": len(short),
            "short_run_p99_ttft_ms": summarise(short)["p99_ttft_ms"],
            "fixed_steady": judged_run(fixed)["steady"],
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
        trend = number(growth, "+.2f")
        return (
            f"{state[ev['steady']]} at {OVERLOAD}x capacity: the waiting queue grows by {trend} "
            f"per arrival and median TTFT climbs {times(ev['ttft_climb'])} from the first quarter "
            f"of requests to the last (the first {ev['short_run_requests']} alone: p99 TTFT "
            f"{ms_value(ev['short_run_p99_ttft_ms'])}, against {ms_value(ev['broken']['p99_ttft_ms'])} for "
            f"the whole run); {ev['replicas']} replicas: {state[ev['fixed_steady']]}, p99 TTFT "
            f"{ms_value(ev['fixed']['p99_ttft_ms'])}"
        )


def judged_run(res) -> dict:
    """The run's own steadiness (a modelled run was judged against its modelled capacity, and
    says so in its stability line); judged from its records when it carries none."""
    return res.result if "steady" in res.result else judge(res.records)
