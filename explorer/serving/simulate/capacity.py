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
    doubled (from num_prompts requests, up to MAX_PROMPTS) until no SLO metric's p99 moves by
    more than CONVERGE_TOL x its SLO (a slowly growing queue keeps moving them: never settled);
  - the rate is bisected (geometrically) between an accepted and a refused rate until they are
    within PRECISION of each other, starting from the modelled capacity (the step model's
    saturation rate, explorer.serving.simulate.run.saturation_rate): half of it and 1.25 x it.

So the answer does not depend on num_prompts (tests/test_simulate.py checks 1x, 2x and 10x).
All of it is modelled: the answer carries the what-if's assumptions.
"""

from __future__ import annotations

import random

from explorer.serving.simulate.run import saturation_rate, simulate
from explorer.serving.simulate.whatif import chip_model
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
MAX_PROMPTS = 16_000  # the longest run (a rate that has not settled by then is refused)
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
        if not rate > 0:
            raise ValueError(f"request rate must be > 0 requests/s, got {rate}")
        wl = Workload(
            n, "poisson", rate, input_len=self.lens[0], output_len=self.lens[1], seed=seed
        )
        arrivals = wl.arrival_times(random.Random(seed))
        # fixed lengths: the token ids are never read, so no prompt is drawn
        reqs = [
            Request(f"req-{i}", [1] * self.lens[0], self.lens[1], t) for i, t in enumerate(arrivals)
        ]
        res = simulate(
            self.info,
            wl,
            "continuous",
            self.model,
            goodput=slos or None,
            requests=reqs,
            **self.knobs,
        )
        row = {k: res.result.get(k) for k in KEYS}
        row.update(request_rate=rate, num_prompts=n, meets_slos=meets(res.result, slos))
        return row


def meets(result: dict, slos: dict) -> bool:
    """Every SLO met at p99 (ttft, tpot, e2el in ms)."""
    return all((result.get(P99[k]) or 0) <= v for k, v in slos.items())


def _settled(a: dict, b: dict, slos: dict) -> bool:
    """Doubling the run moved no SLO's p99 by more than CONVERGE_TOL x that SLO."""
    return all(
        abs((a.get(P99[k]) or 0.0) - (b.get(P99[k]) or 0.0)) <= CONVERGE_TOL * v
        for k, v in slos.items()
    )


def judged_point(setup: Setup, rate: float, num_prompts: int, slos: dict) -> dict:
    """The run at `rate`, doubled until its p99s settle: `accepted` when it is steady, meets
    every SLO and settled; a run that is unstable or over an SLO by more than CONVERGE_TOL is
    refused at once."""
    prev, n = None, num_prompts
    while True:
        row = setup.run(rate, n, slos)
        clearly_over = any((row.get(P99[k]) or 0) > v * (1 + CONVERGE_TOL) for k, v in slos.items())
        settled = prev is not None and _settled(prev, row, slos)
        if row["steady"] is False or clearly_over or settled or 2 * n > MAX_PROMPTS:
            row["settled"] = settled
            row["accepted"] = bool(row["steady"] and row["meets_slos"] and settled)
            return row
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
    if not isinstance(num_prompts, int) or num_prompts < 20:
        raise ValueError(f"num_prompts must be a whole number >= 20, got {num_prompts!r}")
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
    out = {
        "largest_rate": best["request_rate"] if best else None,
        **{k: (best or {}).get(k) for k in KEYS if k != "request_rate"},
        "num_prompts": (best or {}).get("num_prompts"),
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
            f"steady: queueing delay grows < 0.05 s per s of arrivals over the second half; "
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
