"""cold-start: the first requests wait for the weights to load and the engine to warm up.

broken  traffic arrives from t=0 at a server that is still starting: a fresh copy of the model
        is loaded (timed: load_s), then a fresh engine serves the requests. The clock runs from
        the first arrival: a request that arrived during the load was queued until the engine
        started, so its TTFT includes the wait (the measured run's times are shifted by load_s,
        and its sent time is its arrival). Two measured things composed, nothing modelled.
fixed   the same arrivals at a server that loaded and warmed up before taking traffic: the
        engine's warm-up (warmup=True) and one throwaway burst through it first.
"""

from __future__ import annotations

import time
from dataclasses import replace

from explorer._format import ms_value, times
from explorer.serving.metrics import summarise
from explorer.serving.run import ServingResult
from explorer.serving.scenarios import Scenario, ScenarioRun, register
from explorer.serving.scenarios._figures import headline, percentile_ms, ratio
from explorer.serving.workload import Workload

WORKLOAD = {
    "num_prompts": 12,
    "arrival": "fixed",
    "request_rate": 40.0,
    "input_len": 16,
    "output_len": 8,
}
SMALL = {**WORKLOAD, "num_prompts": 8}
OUTLIER = 3.0  # a TTFT above this many times the warm run's median is an outlier


def delayed(res: ServingResult, arrivals: dict[str, float], load_s: float) -> ServingResult:
    """The run as seen from the first arrival at a server that spent load_s starting: every time
    shifted by load_s; a request that arrived before then was sent at its arrival (it waited)."""
    for rec in res.records:
        a = arrivals[rec.id]
        sent = rec.sent_s + load_s if rec.sent_s is not None else None
        rec.sent_s = a if a < load_s else sent
        rec.arrival_s = a
        rec.start_s = None if rec.start_s is None else rec.start_s + load_s
        rec.end_s = None if rec.end_s is None else rec.end_s + load_s
        rec.token_s = [t + load_s for t in rec.token_s]
    for it in res.iterations:
        it.start_s, it.end_s = it.start_s + load_s, it.end_s + load_s
    res.result = summarise(res.records)
    res.meta["cold_start"] = (
        f"the model loaded in {load_s:.3f} s (measured) while requests arrived; those that "
        "arrived meanwhile waited until the engine started"
    )
    return res


@register
class ColdStart(Scenario):
    name, order = "cold-start", 60
    title = "cold start: the first requests wait for loading and warm-up"
    needs = ("warmup",)
    model_ok = False
    fix = "load and warm up before taking traffic (readiness check)"
    why = (
        "A server that accepts requests before it is ready makes the first ones wait for the "
        "weights to load, the KV cache to be allocated and the first passes to warm up "
        "(compilation, CUDA graphs and kernel selection on a GPU). "
        "Those requests show as TTFT outliers that no steady-state benchmark reproduces, "
        "because a benchmark warms the engine up first. "
        "The fix is to load and warm up before the server reports ready, so traffic reaches an "
        "engine that has already run."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": WORKLOAD, "modelled": WORKLOAD}

    def workload(self, ctx) -> Workload:
        return Workload(**self.sizes(ctx), seed=0)

    def execute(self, ctx):
        from explorer.model.loader import load

        lm = ctx.lm
        ctx.say("loading a fresh copy of the model (timed)")
        t0 = time.perf_counter()
        fresh = load(lm.info.name, device=lm.device, dtype=lm.info.dtype)
        load_s = time.perf_counter() - t0
        ctx.notes["load_s"] = load_s
        reqs = self.workload(ctx).requests(fresh)
        late = [replace(r, arrival_s=max(0.0, r.arrival_s - load_s)) for r in reqs]
        res = ctx.serve(
            ScenarioRun("cold (loading as traffic arrives)", late, ctx.engine), lm=fresh
        )
        broken = delayed(res, {r.id: r.arrival_s for r in reqs}, load_s)
        del fresh
        if ctx.stopped():
            return broken, None
        warm = Workload(num_prompts=4, input_len=self.sizes(ctx)["input_len"], output_len=2, seed=1)
        ctx.serve(ScenarioRun("warm-up", warm, ctx.engine, {"warmup": True}), keep=False)
        if ctx.stopped():
            return broken, None
        return broken, ctx.serve(ScenarioRun("warm", reqs, ctx.engine, {"warmup": True}))

    def evidence(self, broken, fixed, notes) -> dict:
        def first(res) -> float | None:
            rec = min(res.records, key=lambda r: r.arrival_s)
            return None if rec.ttft is None else rec.ttft * 1e3

        warm_median = percentile_ms([r.ttft for r in fixed.records if r.ttft is not None], 50)
        cut = None if warm_median is None else OUTLIER * warm_median / 1e3
        b, f = headline(broken), headline(fixed)
        load_s = notes.get("load_s")
        return {
            "load_s": load_s,
            "arrived_while_loading": sum(
                1 for r in broken.records if load_s is not None and r.arrival_s < load_s
            ),
            "first_ttft_ms": {"broken": first(broken), "fixed": first(fixed)},
            "warm_median_ttft_ms": warm_median,
            "ttft_outliers": {
                name: sum(1 for r in res.records if cut and r.ttft is not None and r.ttft > cut)
                for name, res in (("broken", broken), ("fixed", fixed))
            },
            "outlier_threshold": f"TTFT above {OUTLIER:g}x the warm run's median",
            "broken": b,
            "fixed": f,
            "p99_ttft_ratio": ratio(b["p99_ttft_ms"], f["p99_ttft_ms"]),
        }

    def verdict(self, ev: dict) -> str:
        o, first = ev["ttft_outliers"], ev["first_ttft_ms"]
        return (
            f"{ev['arrived_while_loading']} requests arrived during the {ev['load_s']:.2f} s "
            f"load; first TTFT {ms_value(first['broken'])} cold vs {ms_value(first['fixed'])} warm, "
            f"{o['broken']} TTFT outliers cold vs {o['fixed']} warm ({ev['outlier_threshold']}); "
            f"p99 TTFT {times(ev['p99_ttft_ratio'])} the warm run's"
        )
