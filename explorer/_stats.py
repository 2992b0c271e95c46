"""One percentile for the whole project, its method stated.

    percentile([0.010, 0.012, 0.050], 99)   -> 0.04924 (seconds in, seconds out)
    percentile([], 99)                      -> None

Method: linear interpolation between the closest ranks (numpy's default "linear" method, and
what vLLM's `bench serve` reports): the p-th percentile of n sorted values x_0..x_{n-1} is
x_i + (x_{i+1} - x_i) * f where i + f = p / 100 * (n - 1). Not nearest rank: with few values
(a short run's inter-token gaps) a nearest-rank p99 is simply the largest value, while the
interpolated one lies between the two largest. Every p50 / p90 / p99 in explorer/ (the serving
lab's metrics, the scenarios' figures, the pays sweep's serving tricks, the simulator's step-model
errors) comes from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

METHOD = "linear interpolation between closest ranks (numpy 'linear', as vLLM reports)"


def percentile(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile (0 <= p <= 100) of `values` by linear interpolation between the
    closest ranks (METHOD); None when there are no values."""
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile must be between 0 and 100, got {p!r}")
    return float(np.percentile(data, p, method="linear"))
