"""A queue of known load for the steadiness tests (test_steady, test_saturation)."""

from __future__ import annotations

import random

from explorer.serving import RequestRecord


def single_server(rate: float, service_s: float, n: int, seed: int = 0) -> list[RequestRecord]:
    """Poisson arrivals through one first-come server with a fixed service time (Lindley's
    recursion): the records a run of that queue would leave."""
    rng, t, free, out = random.Random(seed), 0.0, 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        start = max(t, free)
        free = start + service_s
        out.append(RequestRecord(f"r{i}", 8, 1, t, t, start, [free], free, 1))
    return out
