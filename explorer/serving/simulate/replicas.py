"""Replicas: N independent copies of a served model (each a GPU group: tp GPUs in tensor
parallel) behind a load balancer. The balancer deals requests round-robin in arrival order, as
Kubernetes' and most HTTP balancers' round-robin policy does: replica k gets requests k, k + N,
k + 2N, ... Each replica is its own engine (its own KV cache, scheduler and iterations), so the
simulator runs each replica's share through its own event loop and merges the records. A
client's concurrency limit is shared out: each replica gets ceil(limit / N) of it.
"""

from __future__ import annotations

import math

from explorer.serving.simulate.whatif_settings import check_replicas

__all__ = ["check_replicas", "deal", "merge_iterations"]


def deal(requests: list, replicas: int, max_concurrency: int | None):
    """[(replica k's requests, its concurrency limit)] for k = 0 .. replicas - 1, round-robin in
    arrival order (empty replicas left out)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    limit = None if max_concurrency is None else math.ceil(max_concurrency / replicas)
    return [(ordered[k::replicas], limit) for k in range(replicas) if ordered[k::replicas]]


def merge_iterations(runs: list[list]) -> list:
    """One replica's iterations as they are; several replicas' in start order (each keeps its
    own index: iterations of different replicas overlap in time)."""
    if len(runs) == 1:
        return runs[0]
    return sorted((it for run in runs for it in run), key=lambda it: it.start_s)
