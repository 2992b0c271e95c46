"""The scheduler policies of the serving lab's engines, one small function per decision.

Each engine's policy turns the simulator's state (who is waiting, who is running) into the next
iteration's plan: which requests run, and with how many query tokens each. They follow the
engines the serving lab measures (explorer.serving.engines):

    sequential   one request at a time, first come first served: its prefill, then one decode
                 pass per token until it is done
    static       up to max_batch waiting requests, padded to the longest prompt; the batch starts
                 when full or max_wait_s after its first request, and runs until its longest ends
    continuous   transformers' FIFO scheduler (5.25): every iteration, decoding requests first, then
                 prompts being prefilled, then waiting ones in arrival order, under max_batch_tokens
                 (a prompt that does not fit is split into chunks) and the paged KV cache's blocks;
                 past 85% of the blocks in use only decodes and one prefill are admitted; a
                 running request that cannot get a block preempts the newest starved requests,
                 which are reset and recomputed later (prompt + the tokens they already had)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from explorer.serving.metrics import RequestRecord

SAFETY_MARGIN = 0.15  # transformers' FIFOScheduler: free-block fraction under which prefills wait


@dataclass(eq=False)
class SimRequest(RequestRecord):
    """A request as the simulator follows it: the serving lab's record, plus the engine's state.
    Compared by identity: `req in waiting` must not compare every field of thousands of requests."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    # continuous-batching state
    prefill_left: int = 0  # prompt (or recompute) tokens not yet in the cache
    cached: int = 0  # tokens whose K/V are in the cache
    blocks: int = 0
    preemptions: int = 0

    @property
    def done(self) -> bool:
        return len(self.token_s) >= self.max_tokens

    @property
    def decoding(self) -> bool:
        return self.prefill_left == 0 and self.token_s != [] and not self.done


@dataclass
class Plan:
    """One iteration: (request, query tokens) rows and the passes the step-time model reads,
    frozen when planned ([query, past] per row; a static batch's padded rows included)."""

    rows: list[tuple[SimRequest, int]]
    passes: list[list[int]]
    preempted: int = 0

    @classmethod
    def of(cls, rows: list[tuple[SimRequest, int]], preempted: int = 0) -> Plan:
        return cls(rows, [[q, r.cached] for r, q in rows], preempted)


# --- sequential and static: batches through a Session ---------------------------------------------


def static_batch_ready(
    waiting: list[SimRequest], now: float, max_batch: int, max_wait_s: float, more_coming: bool
) -> bool:
    """A batch starts when full, when its first request has waited max_wait_s, or when nothing
    more can arrive."""
    if not waiting:
        return False
    if len(waiting) >= max_batch or not more_coming:
        return True
    return now >= static_deadline(waiting, max_wait_s)


def static_deadline(waiting: list[SimRequest], max_wait_s: float) -> float:
    return waiting[0].sent_s + max_wait_s


def session_batch_passes(batch: list[SimRequest], step: int) -> list[list[int]]:
    """The Session's pass `step` for a (left-padded) batch: step 0 the prefill of the longest
    prompt for every row, then one token per row over the padded context."""
    p = max(r.input_len for r in batch)
    if step == 0:
        return [[p, 0]] * len(batch)
    return [[1, p + step - 1]] * len(batch)


# --- continuous: transformers' FIFO scheduler ----------------------------------------------------


def blocks_needed(req: SimRequest, query: int, page: int) -> int:
    """New KV blocks the request needs to hold `query` more tokens."""
    return max(0, math.ceil((req.cached + query) / page) - req.blocks)


def candidates(running: list[SimRequest], waiting: list[SimRequest]) -> list[SimRequest]:
    """Decoding requests first, then prompts mid-prefill, then waiting ones in arrival order."""
    decoding = [r for r in running if r.prefill_left == 0]
    prefilling = [r for r in running if r.prefill_left > 0]
    return decoding + prefilling + list(waiting)


def query_of(req: SimRequest) -> int:
    """Tokens a request would feed: one when decoding, else what is left of its prompt."""
    return req.prefill_left if req.prefill_left > 0 else 1


def in_safety_margin(free_blocks: int, total_blocks: int) -> bool:
    return free_blocks / total_blocks >= SAFETY_MARGIN


def schedule_continuous(running, waiting, free_blocks: int, knobs: dict):
    """The next iteration's rows and the running requests that were starved of blocks."""
    budget, page = knobs["max_batch_tokens"], knobs["page_size"]
    max_requests = knobs.get("max_requests_per_batch") or 1024
    margin = in_safety_margin(free_blocks, knobs["num_blocks"])
    rows, starved = [], []
    for req in candidates(running, waiting):
        if not margin and rows and req.prefill_left > 0:
            break  # past the safety margin: decodes and the first prefill only
        q = min(query_of(req), budget)
        need = blocks_needed(req, q, page)
        if need > free_blocks:
            if req in running:
                starved.append(req)
            continue
        free_blocks -= need
        req.blocks += need
        rows.append((req, q))
        budget -= q
        if budget == 0 or len(rows) >= max_requests:
            break
    return rows, starved


def preempt(starved: list[SimRequest], running: list[SimRequest]) -> list[SimRequest]:
    """Reset the newest starved requests (their blocks freed; prompt + tokens so far recomputed
    later; the caller requeues them at the back, as transformers does) until one running request
    would remain."""
    out = []
    while starved and len(running) - len(out) > 1:
        req = starved.pop()
        req.prefill_left = req.input_len + len(req.token_s)
        req.cached = req.blocks = 0
        req.preemptions += 1
        out.append(req)
    return out
