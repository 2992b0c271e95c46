"""How many GPUs do I need? The largest request rate a setup serves at steady state, on paper.

    ans = capacity(info, "h100", tp=2, input_len=512, output_len=128, slos={"ttft": 500, "tpot": 50})
    ans["largest_rate"], ans["p99_ttft_ms"], ans["utilization"], ans["steady"]
    rows = curve(info, "h100", tp=2, slos=...)      # the latency-throughput curve, for the figure
    cost_per_million(ans, gpus=2, hourly_usd=2.5)

Every point is one simulated run (explorer.serving.simulate) of Poisson arrivals, so it has the
serving lab's result keys; goodput is vLLM's (requests meeting every SLO per second), plus
`steady` and `utilization` (explorer.serving.steady). The search:

  - a rate is accepted only if its run is steady (the waiting queue does not trend up over the
    second half of the arrivals) and every SLO holds at p99, on a run long enough: the run is
    doubled (from max(num_prompts, MIN_PROMPTS) requests, up to MAX_PROMPTS) until two runs
    agree: both refused, or both accepted with no SLO metric's p99 moved by more than
    CONVERGE_TOL x its SLO (a slowly growing queue keeps moving them: never settled, refused);
    so one short run decides nothing, except a hopeless one;
  - the rate is bisected (geometrically) between an accepted and a refused rate until they are
    within PRECISION of each other, starting from the modelled capacity (the step model's
    saturation rate, explorer.serving.simulate.run.saturation_rate): half of it and 1.25 x it.

So the answer does not depend on num_prompts (tests/serving/simulate/test_simulate.py checks 1x,
2x and 10x).
All of it is modelled: the answer carries the what-if's assumptions.
"""

from __future__ import annotations

import math
import random

from explorer.costs.parts import shape_of
from explorer.serving.simulate.policy import SAFETY_MARGIN
from explorer.serving.simulate.run import saturation_rate, simulate
from explorer.serving.simulate.steptime import iteration_work
from explorer.serving.simulate.whatif import chip_model
from explorer.serving.steady import GROWTH_LIMIT
from explorer.serving.workload import Request, Workload

KEYS = (
    "request_rate",
    "output_throughput",
    "request_goodput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "p99_e2el_ms",
    "max_concurrent_requests",
    "steady",
    "queue_growth",
    "utilization",
    "capacity_rps_modelled",
    "stability",
)
P99 = {"ttft": "p99_ttft_ms", "tpot": "p99_tpot_ms", "e2el": "p99_e2el_ms"}
PRECISION = 0.02  # the bisection stops when refused / accepted rate <= 1.02
CONVERGE_TOL = 0.05  # a run is long enough when doubling it moves each p99 by < 5% of its SLO
MIN_PROMPTS = 200  # shorter runs span too few iterations to judge a trend or a p99
HOPELESS = 10  # refused at once: queue growth > 10 x GROWTH_LIMIT (rho > 2), or p99 > 10 x SLO
MAX_PROMPTS = 16_000  # the longest run (a rate that has not settled by then is refused)
RELAXATION = 1.0  # requests x (1 - utilization)^2 a run needs at least (see relaxation_prompts)
UTILIZATIONS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25)  # the curve's rates / capacity


class Setup:
    """A model shape on `tp` x `chip` (the on-paper step model and the KV blocks it implies)."""

    def __init__(self, info, chip: str, tp: int, input_len: int, output_len: int, **overrides):
        self.info, self.tp, self.lens = info, tp, (input_len, output_len)
        self.model, self.extra = chip_model(info, chip, tp, **overrides)
        self.knobs = self.extra["knobs"]
        self.capacity = saturation_rate(
            info, self.model, "continuous", self.knobs, input_len, output_len
        )

    def run(self, rate: float, n: int, slos: dict, seed: int = 1) -> dict:
        """One Poisson run of n requests at `rate`: the result keys, meets_slos, its length."""
        res = self.simulated(rate, n, slos, seed)
        row = {k: res.result.get(k) for k in KEYS}
        row.update(request_rate=rate, num_prompts=n, meets_slos=meets(res.result, slos))
        return row

    def simulated(self, rate: float, n: int, slos: dict, seed: int = 1):
        """The ServingResult of one Poisson run of n requests at `rate`."""
        if not rate > 0:
            raise ValueError(f"request rate must be > 0 requests/s, got {rate}")
        i, o = self.lens
        wl = Workload(n, "poisson", rate, input_len=i, output_len=o, seed=seed)
        arrivals = wl.arrival_times(random.Random(seed))
        # fixed lengths: the token ids are never read, so no prompt is drawn
        reqs = [Request(f"req-{k}", [1] * i, o, t) for k, t in enumerate(arrivals)]
        return simulate(
            self.info,
            wl,
            "continuous",
            self.model,
            goodput=slos or None,
            requests=reqs,
            **self.knobs,
        )

    def binding(self, res) -> dict:
        """What limits a run: the share of its busy time in compute-bound iterations (FLOPs over
        the chip's FLOP/s x efficiency longer than bytes over bandwidth x efficiency), the KV
        cache's peak use, and a one-line verdict."""
        shape, m, busy, compute = shape_of(self.info), self.model, 0.0, 0.0
        for it in res.iterations:
            w = iteration_work(shape, it.passes)
            seconds = it.end_s - it.start_s
            busy += seconds
            flops_s = w["flops"] / (m.tflops * 1e12 * m.settings["flop_efficiency"])
            bytes_s = w["bytes"] / (m.bandwidth_gbps * 1e9 * m.settings["bw_efficiency"])
            compute += seconds if flops_s > bytes_s else 0.0
        kv = max((it.kv_blocks_used or 0) / it.kv_blocks_total for it in res.iterations)
        share = compute / busy if busy else 0.0
        if kv >= 1 - SAFETY_MARGIN:
            verdict = "the KV cache (its blocks run out before the chip's FLOPs or bandwidth)"
        elif share >= 0.5:
            verdict = "FLOPs (most busy time is in compute-bound, prefill-heavy iterations)"
        else:
            verdict = "memory bandwidth (most busy time is in decode steps reading weights and KV)"
        return {"compute_bound_share": share, "kv_peak_share": kv, "verdict": verdict}


def meets(result: dict, slos: dict) -> bool:
    """Every SLO met at p99 (ttft, tpot, e2el in ms)."""
    return all((result.get(P99[k]) or 0) <= v for k, v in slos.items())


def _settled(a: dict, b: dict, slos: dict) -> bool:
    """Doubling the run moved no SLO's p99 by more than CONVERGE_TOL x that SLO."""
    return all(
        abs((a.get(P99[k]) or 0.0) - (b.get(P99[k]) or 0.0)) <= CONVERGE_TOL * v
        for k, v in slos.items()
    )


def relaxation_prompts(utilization: float) -> int:
    """Requests a run needs before its queue forgets the empty start: a queue's relaxation time
    grows as 1 / (1 - utilization)^2 (M/M/1 heavy traffic), so a run near capacity must be long or
    its p99s read low (MAX_PROMPTS + 1 at or past capacity: no run is long enough)."""
    if utilization >= 1:
        return MAX_PROMPTS + 1
    return math.ceil(RELAXATION / (1 - utilization) ** 2)


def judged_point(setup: Setup, rate: float, num_prompts: int, slos: dict) -> dict:
    """The run at `rate`, doubled until two runs (n and 2n requests) agree: both refused
    (unstable or over an SLO), or both accepted (steady, every SLO met) with their p99s settled.
    The first run is at least relaxation_prompts long. Refused at once when hopeless (at or past
    the modelled capacity, or so near it that no run up to MAX_PROMPTS forgets its empty start;
    the queue keeps HOPELESS x GROWTH_LIMIT of the arrivals; a p99 over HOPELESS x its SLO), and
    when MAX_PROMPTS requests have not settled."""
    need = relaxation_prompts(rate / setup.capacity)
    if need > MAX_PROMPTS:
        return {
            "request_rate": rate,
            "num_prompts": 0,
            "steady": False,
            "meets_slos": False,
            "ok": False,
            "settled": False,
            "accepted": False,
        }
    prev, n = None, max(num_prompts, MIN_PROMPTS, need)
    while True:
        row = setup.run(rate, n, slos)
        ok = bool(row["steady"] and row["meets_slos"])
        hopeless = (row["queue_growth"] or 0) > HOPELESS * GROWTH_LIMIT or any(
            (row.get(P99[k]) or 0) > HOPELESS * v for k, v in slos.items()
        )
        agree = prev is not None and prev["ok"] == ok and (not ok or _settled(prev, row, slos))
        if hopeless or agree or 2 * n > MAX_PROMPTS:
            row.update(ok=ok, settled=agree, accepted=ok and agree)
            return row
        row["ok"] = ok
        prev, n = row, 2 * n


def capacity(
    info,
    chip: str,
    *,
    tp: int = 1,
    input_len: int = 512,
    output_len: int = 128,
    slos: dict[str, float],
    num_prompts: int = 200,
    **overrides,
) -> dict:
    """The largest Poisson rate that is steady and meets every SLO at p99 (within PRECISION):
    `largest_rate` (None: not even capacity / 1024 does) with its run's keys, the modelled
    capacity, every probe, and the assumptions."""
    if not slos:
        raise ValueError("the capacity search needs at least one SLO, e.g. ttft:500 tpot:50")
    if not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(f"num_prompts must be a whole number >= 1, got {num_prompts!r}")
    setup = Setup(info, chip, tp, input_len, output_len, **overrides)
    probes: list[dict] = []

    def probe(rate: float) -> dict:
        probes.append(judged_point(setup, rate, num_prompts, slos))
        return probes[-1]

    best, lo, hi = None, setup.capacity / 2, setup.capacity * 1.25
    while probe(hi)["accepted"]:  # the modelled capacity is a guide, not a bound
        best, lo, hi = probes[-1], hi, hi * 1.5
    while best is None and lo > setup.capacity / 1024:
        if probe(lo)["accepted"]:
            best = probes[-1]
        else:
            lo, hi = lo / 4, lo
    while best is not None and hi / lo > 1 + PRECISION:
        mid = (lo * hi) ** 0.5
        if probe(mid)["accepted"]:
            best, lo = probes[-1], mid
        else:
            hi = mid
    return _answer(setup, chip, best, probes, slos)


def _answer(setup: Setup, chip: str, best: dict | None, probes: list[dict], slos: dict) -> dict:
    binding = None
    if best is not None:  # the accepted run again, for what limits it
        res = setup.simulated(best["request_rate"], best["num_prompts"], slos)
        binding = setup.binding(res)
    out = {
        "largest_rate": best["request_rate"] if best else None,
        **{k: (best or {}).get(k) for k in KEYS if k != "request_rate"},
        "num_prompts": (best or {}).get("num_prompts"),
        "binding": binding,
        "capacity_rps_modelled": setup.capacity,
        "slos_ms": dict(slos),
        "precision": PRECISION,
        "probes": [
            {k: p[k] for k in ("request_rate", "num_prompts", "steady", "meets_slos", "accepted")}
            for p in probes
        ],
        "model": setup.info.name,
        "chip": setup.model.chip,
        "tp": setup.tp,
        "input_len": setup.lens[0],
        "output_len": setup.lens[1],
        "modelled": True,
        "assumptions": setup.model.assumptions
        + [
            f"steady: the waiting queue grows < {GROWTH_LIMIT} requests per arrival over the "
            "second half of the arrivals; "
            f"p99s settled (they move < {CONVERGE_TOL:.0%} of their SLO when the run doubles); "
            f"rate bisected "
            f"to {PRECISION:.0%}; modelled capacity {setup.capacity:.3g} req/s (the step "
            "model's fluid saturation rate)"
        ],
        "memory": setup.extra["memory"],
    }
    return out


def curve(
    info,
    chip: str,
    *,
    tp: int = 1,
    input_len: int = 512,
    output_len: int = 128,
    num_prompts: int = 400,
    slos: dict[str, float] | None = None,
    rates: list[float] | None = None,
    **overrides,
) -> list[dict]:
    """One modelled run per rate (default: UTILIZATIONS x the modelled capacity): the serving
    lab's result keys, steady, utilization, meets_slos (steady and every p99 within its SLO)."""
    setup = Setup(info, chip, tp, input_len, output_len, **overrides)
    slos = dict(slos or {})
    rows = []
    for rate in rates or [u * setup.capacity for u in UTILIZATIONS]:
        row = setup.run(rate, num_prompts, slos)
        row["meets_slos"] = bool(row["meets_slos"] and row["steady"])
        rows.append(row)
    for row in rows:
        row.update(chip=setup.model.chip, tp=tp, model=info.name, modelled=True)
    if rows:
        rows[0].update(assumptions=setup.model.assumptions, memory=setup.extra["memory"])
    return rows


def cost_per_million(row: dict, gpus: int, hourly_usd: float) -> float | None:
    """USD per million output tokens at that point's throughput, for gpus x hourly_usd."""
    tput = row.get("output_throughput") or 0
    return gpus * hourly_usd / (tput * 3600) * 1e6 if tput > 0 else None
