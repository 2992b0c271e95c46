"""Requests whose lengths come from somewhere real: a saved result's per-request lengths, or
lengths drawn to match published statistics (ShareGPT's mean prompt and output, say).

    wl, reqs = replay_result(load_result("vllm-result.json"))     # its input_lens, output_lens
    wl, reqs = from_stats(1000, input_mean=217, output_mean=202, spread=1.0, arrival="burst")

Either gives the Workload (arrival process, rate, concurrency: what the simulator reads) and the
requests with those exact lengths, for explorer.serving.simulate.simulate(..., requests=reqs).
Prompt ids are placeholders (the simulator reads only their count). A saved vLLM result has no
arrival times: they are drawn again from its request_rate and burstiness, seeded.
"""

from __future__ import annotations

import math
import random
import statistics

from explorer.serving.workload import Request, Workload

RESULT_KEYS = ("input_lens", "output_lens")


def _rate(value) -> float | None:
    if value in (None, "inf", "Infinity") or (isinstance(value, float) and math.isinf(value)):
        return None
    return float(value)


def workload_for(
    n: int,
    input_lens: list[int],
    output_lens: list[int],
    *,
    request_rate=None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
) -> Workload:
    """The Workload of `n` requests of these lengths (their medians stand for the lengths)."""
    rate = _rate(request_rate)
    arrival = "burst" if rate is None else ("poisson" if burstiness == 1 else "gamma")
    return Workload(
        num_prompts=n,
        arrival=arrival,
        request_rate=rate,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        input_len=max(1, round(statistics.median(input_lens))),
        output_len=max(1, round(statistics.median(output_lens))),
        seed=seed,
    )


def requests_of(wl: Workload, input_lens: list[int], output_lens: list[int]) -> list[Request]:
    """One request per (prompt length, output length), arriving as `wl` says (seeded)."""
    arrivals = wl.arrival_times(random.Random(wl.seed))
    return [
        Request(f"req-{i}", [1] * int(a), max(1, int(b)), t)
        for i, (a, b, t) in enumerate(zip(input_lens, output_lens, arrivals))
    ]


def replay_result(result: dict, where: str = "the result") -> tuple[Workload, list[Request]]:
    """The workload of a saved `vllm bench serve --save-result` JSON (or ours): every completed
    request with its own prompt and output length, at the file's rate and concurrency."""
    missing = [k for k in RESULT_KEYS if k not in result]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} (the per-request lengths to replay)")
    pairs = [
        (int(a), int(b))
        for a, b in zip(result["input_lens"], result["output_lens"])
        if a and b and int(b) > 0
    ]
    if not pairs:
        raise ValueError(f"{where}: no completed request with a prompt and an output length")
    ins, outs = [a for a, _ in pairs], [b for _, b in pairs]
    wl = workload_for(
        len(pairs),
        ins,
        outs,
        request_rate=result.get("request_rate"),
        burstiness=float(result.get("burstiness") or 1.0),
        max_concurrency=result.get("max_concurrency"),
    )
    return wl, requests_of(wl, ins, outs)


def lengths_from_stats(
    n: int, mean: float, spread: float, low: int, high: int | None, rng: random.Random
) -> list[int]:
    """n lengths with this mean: lognormal (sigma = spread; 0 gives every one the mean), kept
    within [low, high], then scaled so that their mean is the published one."""
    if spread == 0:
        return [max(1, round(mean))] * n
    mu = math.log(mean) - spread**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    raw = [min(high or math.inf, max(low, math.exp(rng.gauss(mu, spread)))) for _ in range(n)]
    scale = mean / statistics.fmean(raw)
    return [min(high or math.inf, max(low, round(x * scale))) for x in raw]


def from_stats(
    n: int,
    *,
    input_mean: float,
    output_mean: float,
    spread: float = 0.0,
    input_max: int | None = None,
    output_max: int | None = None,
    request_rate=None,
    max_concurrency: int | None = None,
    seed: int = 0,
) -> tuple[Workload, list[Request]]:
    """n requests whose prompt and output lengths have the published means (see
    lengths_from_stats), arriving at request_rate (None: all at once) under max_concurrency."""
    for name, value in (("input_mean", input_mean), ("output_mean", output_mean)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 1):
            raise ValueError(f"{name} must be a finite number >= 1, got {value!r}")
    if not (math.isfinite(spread) and spread >= 0):
        raise ValueError(f"spread must be a finite number >= 0, got {spread!r}")
    rng = random.Random(seed)
    ins = lengths_from_stats(n, input_mean, spread, 4, input_max, rng)
    outs = lengths_from_stats(n, output_mean, spread, 4, output_max, rng)
    wl = workload_for(
        n, ins, outs, request_rate=request_rate, max_concurrency=max_concurrency, seed=seed
    )
    return wl, requests_of(wl, ins, outs)
