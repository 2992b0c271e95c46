"""Figures every scenario's evidence reads, computed from a run's records and iterations."""

from __future__ import annotations

from explorer._stats import percentile
from explorer.serving.metrics import summarise
from explorer.serving.run import ServingResult
from explorer.serving.scenarios._context import preemptions

HEADLINE = ("p99_ttft_ms", "p99_itl_ms", "output_throughput", "completed", "steady")


def headline(res: ServingResult) -> dict:
    """The figures a scenario compares between its runs, recomputed from the run's records (so a
    hand-made run gets them too), with the engine's preemptions and its slot utilisation."""
    s = summarise(res.records)
    out = {k: s.get(k) for k in HEADLINE}
    out["max_itl_ms"] = percentile_ms([x for r in res.records for x in r.itl], 100)
    out["preemptions"] = preemptions(res)
    out["slot_utilisation"] = slot_utilisation(res)
    return out


def percentile_ms(seconds: list[float], p: float) -> float | None:
    """The percentile (explorer._stats: interpolated, as vLLM) of these seconds, in ms; None when
    empty."""
    got = percentile(seconds, p)
    return None if got is None else got * 1e3


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def slot_utilisation(res: ServingResult) -> float | None:
    """Busy rows / the rows a batch may hold, over the iterations that decode: the engine's batch
    limit (static max_batch: a batch holds its rows, finished or padding, until its longest
    request ends; continuous max_requests_per_batch, a row prefilling a new request busy too).
    None when the run has no such limit."""
    limit = res.engine.get("max_batch") or res.engine.get("max_requests_per_batch")
    busy = [i.decode_requests + i.prefill_requests for i in res.iterations if i.decode_requests]
    return sum(busy) / (limit * len(busy)) if limit and busy else None


def recomputed_tokens(res: ServingResult) -> int:
    """Prompt (and regenerated) tokens the engine prefilled beyond each request's own prompt once:
    the work evictions made it redo (0 when nothing was evicted and reset)."""
    prefilled = sum(i.prefill_tokens for i in res.iterations)
    return max(0, prefilled - sum(r.input_len for r in res.records if r.token_s))
