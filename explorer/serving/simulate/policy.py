"""The scheduler policies of the serving lab's engines: one small class per engine, one small
function per decision.

Each engine's policy turns the simulator's state (who is waiting, who is running) into the next
iteration's plan: which requests run, and with how many query tokens each. A policy is built
from the SAME Knobs object as the real engine (explorer.serving.engines: one declaration per
engine), so the model and the engine cannot drift apart. They follow the engines the serving lab
measures:

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
from typing import ClassVar

from explorer._registry import Registry
from explorer.serving import engines
from explorer.serving.engines.continuous import ContinuousKnobs, check_kv_budget
from explorer.serving.metrics import RequestRecord

SAFETY_MARGIN = 0.15  # transformers' FIFOScheduler: free-block fraction under which prefills wait


@dataclass(eq=False)
class SimRequest(RequestRecord):
    """A request as the simulator follows it: the serving lab's record, plus the engine's state.
    Compared by identity (`req in waiting`): comparing every field made a 1,000-request burst
    spend 85% of its time in __eq__."""

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


def schedule_continuous(running, waiting, free_blocks: int, knobs: ContinuousKnobs):
    """The next iteration's rows and the running requests that were starved of blocks."""
    budget, page = knobs.max_batch_tokens, knobs.page_size
    max_requests = knobs.max_requests_per_batch or 1024
    margin = in_safety_margin(free_blocks, knobs.num_blocks)
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


# --- one policy class per engine ------------------------------------------------------------------

POLICIES: Registry[type[Policy]] = Registry(
    "simulator policy",
    "simulator policies",
    order=lambda cls: getattr(engines.ENGINES.entries.get(cls.engine), "order", 1000),
)


def policy(engine: str):
    """Class decorator: the simulator's policy for the registered engine `engine`."""

    def wrap(cls):
        cls.engine = engine
        return POLICIES.add(engine, cls)

    return wrap


def modelled() -> tuple[str, ...]:
    """The engines the simulator models, in the engines' order."""
    return tuple(POLICIES.names())


def policy_for(engine: str, knobs: engines.Knobs) -> Policy:
    """The policy of `engine`, built from the knobs the real engine takes."""
    return POLICIES.get(engine)(knobs)


class Policy:
    """An engine's scheduling, as the event loop (explorer.serving.simulate.events) asks for it."""

    engine: ClassVar[str]
    paged: ClassVar[bool] = False  # a paged KV cache whose blocks the iterations record
    assumption: ClassVar[str | None] = None  # how it schedules, for the result's assumptions

    def __init__(self, knobs: engines.Knobs):
        expected = engines.get(self.engine).Knobs
        if not isinstance(knobs, expected):
            raise TypeError(f"the {self.engine} policy takes {expected.__name__}")
        self.knobs = knobs

    def check(self, requests) -> None:
        """A clear ValueError before the run, if the engine could never serve the requests."""

    def plan(self, sim) -> Plan | None:
        """The next iteration (None or no rows: nothing to run now)."""
        raise NotImplementedError

    def finished(self, plan: Plan) -> None:
        """An iteration of `plan` ended (its tokens have landed)."""

    @property
    def kv_blocks_total(self) -> int | None:
        return None


class SessionBatch(Policy):
    """A Session batch at a time: taken when ready, stepped until its longest request ends."""

    def __init__(self, knobs):
        super().__init__(knobs)
        self.batch: list[SimRequest] = []
        self.batch_step = 0

    def limits(self) -> tuple[int, float]:
        """(requests per batch, how long a batch waits to fill)."""
        raise NotImplementedError

    def plan(self, sim) -> Plan | None:
        if not self.batch:
            limit, wait = self.limits()
            if not static_batch_ready(sim.waiting, sim.now, limit, wait, sim.more_coming):
                if sim.waiting:  # wake up at the wait limit
                    sim.push(static_deadline(sim.waiting, wait), "wake")
                return None
            self.batch, sim.waiting = sim.waiting[:limit], sim.waiting[limit:]
            self.batch_step = 0
        passes = session_batch_passes(self.batch, self.batch_step)
        return Plan([(r, q) for r, (q, _) in zip(self.batch, passes)], passes)

    def finished(self, plan: Plan) -> None:
        self.batch_step += 1
        if all(r.done for r in self.batch):
            self.batch = []


@policy("sequential")
class SequentialPolicy(SessionBatch):
    def __init__(self, knobs):
        super().__init__(knobs)
        if knobs.prefix_caching:
            raise ValueError("the simulator does not model the sequential engine's prefix caching")

    def limits(self) -> tuple[int, float]:
        return 1, 0.0


@policy("static")
class StaticPolicy(SessionBatch):
    def limits(self) -> tuple[int, float]:
        return self.knobs.max_batch, self.knobs.max_wait_s


@policy("continuous")
class ContinuousPolicy(Policy):
    paged = True
    assumption = (
        "scheduler: transformers' FIFO (decodes, then prefills, then waiting; chunked under "
        "max_batch_tokens; 15% free-block safety margin; preemption resets and recomputes)"
    )

    def __init__(self, knobs: ContinuousKnobs):
        super().__init__(knobs)
        if knobs.scheduler != "fifo":
            raise ValueError("the simulator models transformers' fifo scheduler only")

    def check(self, requests) -> None:
        check_kv_budget(requests, self.knobs)

    @property
    def kv_blocks_total(self) -> int:
        return self.knobs.num_blocks

    def plan(self, sim) -> Plan | None:
        free = self.knobs.num_blocks - sum(r.blocks for r in sim.running)
        rows, starved = schedule_continuous(sim.running, sim.waiting, free, self.knobs)
        preempted = preempt(starved, sim.running) if starved else []
        for req in preempted:
            sim.running.remove(req)
            sim.waiting.append(req)
        waiting = {id(r) for r in sim.waiting}
        admitted = {id(req) for req, _ in rows if id(req) in waiting}
        if admitted:  # one pass, not a list search per row (a large burst is quadratic otherwise)
            sim.running.extend(req for req, _ in rows if id(req) in admitted)
            sim.waiting = [r for r in sim.waiting if id(r) not in admitted]
        return Plan.of(rows, preempted=len(preempted))
