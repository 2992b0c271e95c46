"""How many GPUs do I need? The largest request rate a setup serves at steady state, on paper.

    ans = capacity(info, "h100", tp=2, input_len=512, output_len=128, slos={"ttft": 500, "tpot": 50})
    ans["largest_rate"], ans["p99_ttft_ms"], ans["utilization"], ans["steady"]
    rows = curve(info, "h100", tp=2, slos=...)      # the latency-throughput curve, for the figure
    cost_per_million(ans, gpus=2, hourly_usd=2.5)     # from the steady-state throughput only

Every point is one simulated run (explorer.serving.simulate) of Poisson arrivals, so it has the
serving lab's result keys; goodput is vLLM's (requests meeting every SLO per second), plus
`steady`, `steadiness` and `utilization` (explorer.serving.steady). With replicas=N the rate is
dealt round-robin over N independent replicas of tp GPUs each (explorer.serving.simulate.replicas).
The search:

  - a rate is accepted only if CHECK_PROMPTS-request runs (8,000) with each of CHECK_SEEDS
    (0, 1, 2) are all stable (explorer.serving.steady: neither overloaded nor backlogged) and
    meet every SLO at p99; a shorter screening run first (max(num_prompts, MIN_PROMPTS, the
    queue's relaxation, CHECK_PROMPTS / 4) requests) refuses what is clearly refused without the
    long runs;
  - why 8,000 requests: the p99 is then the 80th-largest of 8,000 TTFTs, not the 2nd of 200;
    8,000 arrivals are 20 x the relaxation time of a queue at 95% load (1 / (1 - rho)^2 = 400
    arrivals), so the empty start is forgotten, and a rate nearer the modelled capacity than that
    (fewer than SETTLE = 20 relaxation times in a check run) is refused: there a p99 TTFT still
    moves from seed to seed by more than the SLO's margin (8B on 2 H100s at 98% of it: 314-478 ms
    on seeds 0-2, 549-921 ms on seeds 3-5); and the backlog test's false-alarm and miss
    rates at that length are the calibrated ones (explorer.serving.simulate.saturation). Why
    several seeds: one Poisson draw of 8,000 requests near capacity can be lucky; the issue's
    case (40.2 req/s accepted on a 534-request probe) missed its TTFT SLO on all of seeds 0-2;
  - a TPOT SLO below the lowest TPOT any rate gives (Setup.tpot_floor_ms: one request decoding
    alone) is refused without a search (`refused` says why);
  - the rate is bisected (geometrically) between an accepted and a refused rate until they are
    within PRECISION of each other, starting from the modelled capacity (the step model's
    saturation rate, explorer.serving.simulate.run.saturation_rate): half of it and 1.25 x it.

All of it is modelled: the answer carries the what-if's assumptions.
"""

from __future__ import annotations

import math
import random

from explorer.costs.parts import shape_of
from explorer.serving.simulate.engine_policies import chip_knobs
from explorer.serving.simulate.policy import SAFETY_MARGIN
from explorer.serving.simulate.run import saturation_rate, simulate
from explorer.serving.simulate.whatif import chip_model
from explorer.serving.simulate.whatif_settings import check_replicas
from explorer.serving.steady import BACKLOG_Z, GROWTH_LIMIT
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
    "steadiness",
    "queue_growth",
    "backlog_z",
    "utilization",
    "capacity_rps_modelled",
    "stability",
)
P99 = {"ttft": "p99_ttft_ms", "tpot": "p99_tpot_ms", "e2el": "p99_e2el_ms"}
PRECISION = 0.02  # the bisection stops when refused / accepted rate <= 1.02
MIN_PROMPTS = 200  # shorter runs span too few iterations to judge a trend or a p99
CHECK_PROMPTS = 8000  # each seed's run before a rate is accepted (see the module docstring)
CHECK_SEEDS = (0, 1, 2)
MAX_PROMPTS = 16_000  # the longest run (a rate that has not settled by then is refused)
RELAXATION = 1.0  # requests x (1 - utilization)^2 a run needs at least (see relaxation_prompts)
SETTLE = 20  # a check run spans at least this many relaxation times (else the rate is refused)
LIMITS = ("memory bandwidth", "FLOPs", "overheads")  # an IterationTime's limit (steptime.largest)
VERDICTS = {
    "FLOPs": "FLOPs (most busy time is in compute-bound, prefill-heavy iterations)",
    "memory bandwidth": "memory bandwidth (most busy time is in decode steps reading weights "
    "and KV)",
    "overheads": "overheads (most busy time is per-step and per-request overhead or all-reduces)",
}
UTILIZATIONS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25)  # the curve's rates / capacity


class Setup:
    """A model shape on `replicas` x `tp` x `chip` (the on-paper step model and the KV blocks it
    implies; the modelled capacity is the replicas' together), scheduled by the policy of
    overrides' `engine` (default continuous; vllm, vllm-v0, sglang, trtllm: their own knobs on
    the chip, engine_policies.chip_knobs)."""

    def __init__(
        self,
        info,
        chip: str,
        tp: int,
        input_len: int,
        output_len: int,
        replicas: int = 1,
        **overrides,
    ):
        check_replicas(replicas)
        self.info, self.tp, self.replicas, self.lens = info, tp, replicas, (input_len, output_len)
        self.engine = overrides.pop("engine", "continuous")  # the scheduler's policy
        self.model, self.extra = chip_model(info, chip, tp, engine=self.engine, **overrides)
        self.knobs = chip_knobs(self.engine, self.extra, chip)
        one = saturation_rate(info, self.model, self.engine, self.knobs, input_len, output_len)
        self.capacity = replicas * one

    def run(self, rate: float, n: int, slos: dict, seed: int = 1) -> dict:
        """One Poisson run of n requests at `rate`: the result keys, meets_slos, its length."""
        res = self.simulated(rate, n, slos, seed)
        row = {k: res.result.get(k) for k in KEYS}
        row.update(request_rate=rate, num_prompts=n, meets_slos=meets(res.result, slos))
        row.update(output_len=self.lens[1])
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
            self.engine,
            self.model,
            goodput=slos or None,
            requests=reqs,
            replicas=self.replicas,
            **self.knobs,
        )

    def tpot_floor_ms(self) -> float:
        """The lowest TPOT any rate can give (ms): one request decoding alone right after its
        prompt, plus the idle gap between iterations. Every iteration that decodes a request does
        at least that pass's work, and no term of the step model falls as the work grows."""
        seconds = self.model.seconds(shape_of(self.info), [[1, self.lens[0]]]) + self.model.gap_s
        return 1e3 * seconds

    def binding(self, res) -> dict:
        """What limits a run: each iteration timed again by the run's own machine
        (self.model.step: the same work and the same terms the simulation timed it with), the
        share of busy time whose largest term is FLOPs, memory bandwidth or overheads, the
        bytes and FLOPs per iteration, the KV cache's peak use, and a one-line verdict."""
        shape, busy, work = shape_of(self.info), dict.fromkeys(LIMITS, 0.0), [0.0, 0.0]
        for it in res.iterations:
            step = self.model.step(shape, it.passes)
            busy[step.limit] += step.seconds
            work[0] += step.work.bytes
            work[1] += step.work.flops
        total, n = sum(busy.values()), max(1, len(res.iterations))
        share = {k: (v / total if total else 0.0) for k, v in busy.items()}
        kv = max((it.kv_blocks_used or 0) / it.kv_blocks_total for it in res.iterations)
        if kv >= 1 - SAFETY_MARGIN:
            verdict = "the KV cache (its blocks run out before the chip's FLOPs or bandwidth)"
        else:
            verdict = VERDICTS[max(share, key=share.get)]
        return {
            "compute_bound_share": share["FLOPs"],
            "bound_shares": share,
            "bytes_per_iteration": work[0] / n,
            "flops_per_iteration": work[1] / n,
            "kv_peak_share": kv,
            "verdict": verdict,
        }


def meets(result: dict, slos: dict) -> bool:
    """Every SLO met at p99 (ttft, tpot, e2el in ms)."""
    return all((result.get(P99[k]) or 0) <= v for k, v in slos.items())


def relaxation_prompts(utilization: float) -> int:
    """Requests a run needs before its queue forgets the empty start: a queue's relaxation time
    grows as 1 / (1 - utilization)^2 (M/M/1 heavy traffic), so a run near capacity must be long or
    its p99s read low (MAX_PROMPTS + 1 at or past capacity: no run is long enough)."""
    if utilization >= 1:
        return MAX_PROMPTS + 1
    return math.ceil(RELAXATION / (1 - utilization) ** 2)


def _refused(rate: float, n: int = 0) -> dict:
    return {
        "request_rate": rate,
        "num_prompts": n,
        "steady": False,
        "meets_slos": False,
        "ok": False,
        "accepted": False,
        "seed_runs": [],
    }


def judged_point(
    setup: Setup,
    rate: float,
    num_prompts: int,
    slos: dict,
    check_prompts: int = CHECK_PROMPTS,
    seeds=CHECK_SEEDS,
) -> dict:
    """The rate, accepted only when a `check_prompts`-request run with every seed in `seeds` is
    stable and meets every SLO at p99 (the row returned is the worst seed's: highest p99 TTFT).
    Refused at once when hopeless (at or past the modelled capacity, or so near it that no run
    up to MAX_PROMPTS forgets its empty start, or the check runs span fewer than SETTLE
    relaxation times: for 8,000 requests, past 95% of the modelled capacity), and when a shorter
    screening run (max(num_prompts, MIN_PROMPTS, relaxation_prompts, check_prompts / 4)
    requests, the first seed) is refused."""
    need = relaxation_prompts(rate / setup.capacity)
    if need > MAX_PROMPTS or SETTLE * need > check_prompts:
        return _refused(rate)
    screen = max(num_prompts, MIN_PROMPTS, need, check_prompts // 4)
    runs = []
    if screen < check_prompts:
        row = setup.run(rate, screen, slos, seed=seeds[0])
        if not (row["steady"] and row["meets_slos"]):
            return {**row, "ok": False, "accepted": False, "seed_runs": [_seed_row(row, seeds[0])]}
    for seed in seeds:
        row = setup.run(rate, max(check_prompts, screen), slos, seed=seed)
        runs.append((row, seed))
        if not (row["steady"] and row["meets_slos"]):
            break
    ok = all(r["steady"] and r["meets_slos"] for r, _ in runs) and len(runs) == len(seeds)
    worst = max((r for r, _ in runs), key=lambda r: r.get("p99_ttft_ms") or 0.0)
    if not ok:
        worst = runs[-1][0]
    return {**worst, "ok": ok, "accepted": ok, "seed_runs": [_seed_row(r, s) for r, s in runs]}


def _seed_row(row: dict, seed: int) -> dict:
    keys = ("num_prompts", "steadiness", "p99_ttft_ms", "p99_tpot_ms", "meets_slos")
    return {"seed": seed, **{k: row.get(k) for k in keys}}


def capacity(
    info,
    chip: str,
    *,
    tp: int = 1,
    replicas: int = 1,
    input_len: int = 512,
    output_len: int = 128,
    slos: dict[str, float],
    num_prompts: int = 200,
    check_prompts: int = CHECK_PROMPTS,
    seeds=CHECK_SEEDS,
    **overrides,
) -> dict:
    """The largest Poisson rate whose check_prompts-request runs with every seed are stable and
    meet every SLO at p99 (within PRECISION): `largest_rate` (None: not even capacity / 1024
    does) with its worst run's keys, the modelled capacity, every probe, and the assumptions."""
    if not slos:
        raise ValueError("the capacity search needs at least one SLO, e.g. ttft:500 tpot:50")
    for name, n in (("num_prompts", num_prompts), ("check_prompts", check_prompts)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {n!r}")
    if not seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise ValueError(f"seeds must be one or more whole numbers, got {seeds!r}")
    setup = Setup(info, chip, tp, input_len, output_len, replicas, **overrides)
    floor = setup.tpot_floor_ms()
    if slos.get("tpot") is not None and floor > slos["tpot"]:  # no rate can meet it: no search
        ans = _answer(setup, chip, None, [], slos, tuple(seeds))
        why = f"one request decoding alone takes {floor:.3g} ms per token (modelled)"
        return {**ans, "tpot_floor_ms": floor, "refused": f"p99 TPOT {slos['tpot']:g} ms: {why}"}
    probes: list[dict] = []

    def probe(rate: float) -> dict:
        probes.append(judged_point(setup, rate, num_prompts, slos, check_prompts, tuple(seeds)))
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
    ans = _answer(setup, chip, best, probes, slos, tuple(seeds))
    return {**ans, "tpot_floor_ms": floor, "refused": None}


def holds(setup: Setup, rate: float, slos: dict, n: int = CHECK_PROMPTS, seeds=CHECK_SEEDS):
    """One n-request run per seed at `rate`: [{seed, steadiness, p99s, meets_slos, ok}] (ok:
    stable and every SLO met). The check of an answer: it holds at the answer; at 1.05 x it at
    least one seed should not."""
    out = []
    for seed in seeds:
        row = setup.run(rate, n, slos, seed=seed)
        out.append({**_seed_row(row, seed), "ok": bool(row["steady"] and row["meets_slos"])})
    return out


def _answer(
    setup: Setup, chip: str, best: dict | None, probes: list[dict], slos: dict, seeds: tuple
) -> dict:
    binding = None
    if best is not None:  # the accepted rate's first seed again, for what limits it
        res = setup.simulated(best["request_rate"], best["num_prompts"], slos, seed=seeds[0])
        binding = setup.binding(res)
    shown = ("request_rate", "num_prompts", "steady", "meets_slos", "accepted", "seed_runs")
    return {
        "largest_rate": best["request_rate"] if best else None,
        **{k: (best or {}).get(k) for k in KEYS if k != "request_rate"},
        "num_prompts": (best or {}).get("num_prompts"),
        "seed_runs": (best or {}).get("seed_runs"),
        "binding": binding,
        "capacity_rps_modelled": setup.capacity,
        "slos_ms": dict(slos),
        "precision": PRECISION,
        "probes": [{k: p.get(k) for k in shown} for p in probes],
        "model": setup.info.name,
        "chip": setup.model.chip,
        "tp": setup.tp,
        "replicas": setup.replicas,
        "gpus": setup.tp * setup.replicas,
        "input_len": setup.lens[0],
        "output_len": setup.lens[1],
        "modelled": True,
        "assumptions": setup.model.assumptions
        + _replica_line(setup)
        + [
            f"accepted only where {best['num_prompts'] if best else CHECK_PROMPTS}-request runs "
            f"with seeds {', '.join(map(str, seeds))} are all stable (the waiting queue grows < "
            f"{GROWTH_LIMIT} per arrival and its late peak stays under {BACKLOG_Z} x "
            "sqrt(arrivals)) and meet every SLO at p99, and that span at least "
            f"{SETTLE} relaxation times (1 / (1 - utilization)^2 requests each); "
            f"rate bisected to {PRECISION:.0%}; modelled capacity {setup.capacity:.3g} req/s "
            "(the step model's fluid saturation rate)"
        ],
        "memory": setup.extra["memory"],
        "steady_output_throughput": steady_output_throughput(
            {**(best or {}), "output_len": setup.lens[1]}
        ),
    }


def _replica_line(setup: Setup) -> list[str]:
    if setup.replicas == 1:
        return []
    return [
        f"{setup.replicas} replicas of {setup.tp} GPU(s) each behind a round-robin load "
        f"balancer ({setup.replicas * setup.tp} GPUs)"
    ]


def curve(
    info,
    chip: str,
    *,
    tp: int = 1,
    replicas: int = 1,
    input_len: int = 512,
    output_len: int = 128,
    num_prompts: int = 400,
    slos: dict[str, float] | None = None,
    rates: list[float] | None = None,
    **overrides,
) -> list[dict]:
    """One modelled run per rate (default: UTILIZATIONS x the modelled capacity): the serving
    lab's result keys, steady, utilization, meets_slos (steady and every p99 within its SLO)."""
    setup = Setup(info, chip, tp, input_len, output_len, replicas, **overrides)
    slos = dict(slos or {})
    rows = []
    for rate in rates or [u * setup.capacity for u in UTILIZATIONS]:
        row = setup.run(rate, num_prompts, slos)
        row["meets_slos"] = bool(row["meets_slos"] and row["steady"])
        rows.append(row)
    for row in rows:
        row.update(chip=setup.model.chip, tp=tp, replicas=replicas, model=info.name, modelled=True)
    if rows:
        rows[0].update(
            assumptions=setup.model.assumptions + _replica_line(setup), memory=setup.extra["memory"]
        )
    return rows


def steady_output_throughput(row: dict) -> float | None:
    """Output tokens/s at steady state: the offered rate x output tokens per request (the lengths
    are fixed), for a stable run only; None for a run judged unstable or not judged (past
    saturation there is no rate to quote). A finite run's `output_throughput` divides by its
    whole span, the drain after the last arrival included, so it reads low (8B on one H100 at
    32 req/s: 2.6% low on 2,000 requests; the shorter the run, the lower)."""
    rate = row.get("largest_rate", row.get("request_rate"))
    out = row.get("output_len")
    if row.get("steady") is not True or not rate or not out:
        return None
    return rate * out


def cost_per_million(row: dict, gpus: int, hourly_usd: float) -> float | None:
    """USD per million output tokens at that point's steady-state throughput
    (steady_output_throughput), for gpus x hourly_usd; None for an unstable run."""
    tput = steady_output_throughput(row) or 0
    return gpus * hourly_usd / (tput * 3600) * 1e6 if tput > 0 else None
