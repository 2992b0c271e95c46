"""Analytic service rates: the largest request rate (req/s) an engine's step model drains for
requests of `i` prompt and `o` >= 2 output tokens, with no run (one output token: one request at
a time, steptime.one_at_a_time_rate, for every engine). Each policy class owns its capacity
(Policy.saturation_rate) and builds it from one of these shapes:

    batch_rate   full batches of b: b / (the batch's prefill + its decodes + gaps) (b = 1: one
                 request at a time)
    mixed_rate   prefills and decodes share an iteration (chunked prefill or inflight batching):
                 each iteration admits k prompts while k x (o - 1) requests decode one token, so
                 k requests finish per iteration: rate(k) = k / iteration seconds, the largest
                 over k up to what the KV cache (`rows` decoding requests at most) and the token
                 budget allow (fewer than one prompt per iteration: one prompt's iteration every
                 (o - 1) / n iterations among n decoding requests)
    split_rate   prefill steps apart from decode steps (vLLM V0 without chunking, SGLang):
                 r = 1 / (T_prefill(k) / k + (o - 1) x T_decode(n) / n), n decoding requests at
                 most (`rows`), k prompts per prefill step under the token budget
"""

from __future__ import annotations


def batch_rate(model, shape, i: int, o: int, b: int) -> float:
    """b requests at a time, each batch run to its end (the sequential and static engines)."""
    s = model.seconds(shape, [[i, 0]] * b) + o * model.gap_s
    s += sum(model.seconds(shape, [[1, i + k]] * b) for k in range(o - 1))
    return b / s


def _mixed_seconds(model, shape, i: int, o: int, decoding: int, prompts: int) -> float:
    passes = [[1, i + o // 2]] * decoding + [[i, 0]] * prompts
    return model.seconds(shape, passes) + model.gap_s


def mixed_rate(model, shape, i: int, o: int, rows: float, budget: int) -> float:
    """Prefills beside decodes in one iteration: `rows` decoding requests at most (KV cache and
    max sequences), `budget` tokens per iteration."""
    k_max = min(rows / (o - 1), budget / (o - 1 + i))
    if k_max < 1:  # one prompt every (o - 1) / n iterations among n decoding requests
        n = max(1, int(rows))
        t0 = _mixed_seconds(model, shape, i, o, n, 0)
        t = t0 + (_mixed_seconds(model, shape, i, o, n, 1) - t0) * n / (o - 1)
        return n / ((o - 1) * t)
    best, k = 0.0, 1
    while True:
        best = max(best, k / _mixed_seconds(model, shape, i, o, k * (o - 1), k))
        if k >= int(k_max):
            return best
        k = min(int(k_max), max(k + 1, int(k * 1.25)))


def split_rate(model, shape, i: int, o: int, rows: float, budget: int) -> float:
    """Prefill-only steps of k prompts, decode steps of n requests."""
    n = max(1, int(rows))
    k = max(1, min(n, budget // max(1, i)))
    t_prefill = model.seconds(shape, [[i, 0]] * k) + model.gap_s
    t_decode = model.seconds(shape, [[1, i + o // 2]] * n) + model.gap_s
    return 1.0 / (t_prefill / k + (o - 1) * t_decode / n)
