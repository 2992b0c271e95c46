"""How many GPUs do I need? The latency-throughput curve of a setup, on paper, and its answer.

    rows = curve(info, "h100", tp=2, input_len=512, output_len=128, slos={"ttft": 500, "tpot": 50})
    best = largest_rate(rows)           # the highest request rate whose p99s meet the SLOs
    cost_per_million(best, gpus=2, hourly_usd=2.5)

Each point is one simulated run (explorer.serving.simulate) at a Poisson request rate, so it has
the serving lab's result keys; goodput is vLLM's (requests meeting every SLO per second). All of
it is modelled: the rows carry the what-if's assumptions.
"""

from __future__ import annotations

from explorer.serving.simulate.run import simulate
from explorer.serving.simulate.steptime import one_at_a_time_rate
from explorer.serving.simulate.whatif import chip_model
from explorer.serving.workload import Workload

KEYS = (
    "request_rate",
    "output_throughput",
    "request_goodput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "max_concurrent_requests",
)


def default_rates(info, model, input_len: int, output_len: int, n: int = 10) -> list[float]:
    """Rates from a fifth of one-request-at-a-time service up to well past the knee."""
    base = one_at_a_time_rate(info, model, input_len, output_len)
    return [base * f for f in (0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256)[:n]]


def curve(
    info,
    chip: str,
    *,
    tp: int = 1,
    input_len: int = 512,
    output_len: int = 128,
    num_prompts: int = 200,
    slos: dict[str, float] | None = None,
    rates: list[float] | None = None,
    **overrides,
) -> list[dict]:
    """One modelled run per rate: the serving lab's result keys, meets_slos, and assumptions."""
    model, extra = chip_model(info, chip, tp, **overrides)
    rates = rates or default_rates(info, model, input_len, output_len)
    slos = dict(slos or {})
    rows = []
    for rate in rates:
        wl = Workload(
            num_prompts, "poisson", rate, input_len=input_len, output_len=output_len, seed=1
        )
        r = simulate(info, wl, "continuous", model, goodput=slos or None, **extra["knobs"]).result
        row = {k: r.get(k) for k in KEYS}
        row["request_rate"] = rate
        row["meets_slos"] = _meets(r, slos)
        rows.append(row)
    for row in rows:
        row.update(chip=model.chip, tp=tp, model=info.name, modelled=True)
    if rows:
        rows[0].update(assumptions=model.assumptions, memory=extra["memory"])
    return rows


def _meets(result: dict, slos: dict) -> bool:
    """Every SLO met at p99 (ttft, tpot, e2el in ms)."""
    keys = {"ttft": "p99_ttft_ms", "tpot": "p99_tpot_ms", "e2el": "p99_e2el_ms"}
    return all((result.get(keys[k]) or 0) <= v for k, v in slos.items())


def largest_rate(rows: list[dict]) -> dict | None:
    """The highest-rate point that meets the SLOs (None: not even the lowest rate does)."""
    ok = [r for r in rows if r["meets_slos"]]
    return max(ok, key=lambda r: r["request_rate"]) if ok else None


def cost_per_million(row: dict, gpus: int, hourly_usd: float) -> float | None:
    """USD per million output tokens at that point's throughput, for gpus x hourly_usd."""
    tput = row.get("output_throughput") or 0
    return gpus * hourly_usd / (tput * 3600) * 1e6 if tput > 0 else None
