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
from dataclasses import dataclass, field
from typing import ClassVar

from explorer._registry import Registry
from explorer.costs.parts import shape_of
from explorer.serving import engines
from explorer.serving.engines.continuous import ContinuousKnobs, check_kv_budget
from explorer.serving.metrics import RequestRecord
from explorer.serving.simulate.rates import batch_rate, mixed_rate
from explorer.serving.simulate.steptime import one_at_a_time_rate

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
    # multi-step scheduling (vLLM V0's --num-scheduler-steps): the passes of the steps after the
    # first; every row whose prompt is done gets up to 1 + len(more) tokens, all landing when the
    # last step ends (the client sees them in one burst)
    more: list[list[list[int]]] = field(default_factory=list)

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
    order=lambda cls: getattr(engines.ENGINES.entries.get(cls.engine), "order", cls.order),
)


def policy(engine: str):
    """Class decorator: the simulator's policy for the engine `engine` (a lab engine registered
    in explorer.serving.engines, or a served engine whose Knobs the policy declares itself)."""

    def wrap(cls):
        cls.engine = engine
        return POLICIES.add(engine, cls)

    return wrap


def modelled() -> tuple[str, ...]:
    """The engines the simulator models, in the engines' order."""
    return tuple(POLICIES.names())


def policy_class(engine: str) -> type[Policy]:
    """The policy class of `engine` (ValueError: one line listing the engines it models)."""
    if engine not in POLICIES:
        raise ValueError(
            f"the simulator has no policy for engine {engine!r}; it models {', '.join(modelled())}"
        )
    return POLICIES.get(engine)


def policy_for(engine: str, knobs: engines.Knobs) -> Policy:
    """The policy of `engine`, built from the knobs the real engine takes."""
    return policy_class(engine)(knobs)


def knobs_class(engine: str) -> type[engines.Knobs]:
    """The Knobs class of `engine`: its policy's own (a served engine), else the lab engine's."""
    own = POLICIES.entries.get(engine)
    return own.Knobs if own is not None and own.Knobs is not None else engines.get(engine).Knobs


def knob_table(names) -> dict[str, tuple]:
    """{knob: (its Spec, its default, the engines that take it)} over these engines' knobs (the
    served engines' policies' own included): what the simulate command's flags are built from."""
    out: dict[str, tuple] = {}
    for name in names:
        defaults = knobs_class(name)()
        for knob, spec in defaults.specs().items():
            out.setdefault(knob, (spec, getattr(defaults, knob), []))[2].append(name)
    return out


def knobs_for(engine: str, given: dict) -> engines.Knobs:
    """The validated Knobs of `engine`'s policy from the knob names in `given` (its defaults
    for the rest; ValueError naming a knob it does not take)."""
    cls = policy_class(engine)
    if cls.Knobs is None:  # a lab engine: its own Knobs, checked by the engines' registry
        return engines.knobs_of(engine, given)[0]
    fields = cls.Knobs.specs()
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(
            f"the {engine} policy has no knob {', '.join(unknown)}; its knobs are "
            f"{', '.join(fields)}"
        )
    return cls.Knobs(**given)


class Policy:
    """An engine's scheduling, as the event loop (explorer.serving.simulate.events) asks for it,
    and its analytic capacity (saturation_rate)."""

    engine: ClassVar[str]
    Knobs: ClassVar[type | None] = None  # its own knobs (a served engine); None: the lab engine's
    order: ClassVar[int] = 1000  # listed after the lab engines (theirs come from the engines)
    on_paper: ClassVar[bool] = False  # runs the chip what-if (--hardware): a paged KV cache
    paged: ClassVar[bool] = False  # a paged KV cache whose blocks the iterations record
    assumption: ClassVar[str | None] = None  # how it schedules, for the result's assumptions

    def __init__(self, knobs: engines.Knobs):
        expected = self.Knobs or engines.get(self.engine).Knobs
        if not isinstance(knobs, expected):
            raise TypeError(f"the {self.engine} policy takes {expected.__name__}")
        self.knobs = knobs

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        """The knobs on a chip on paper: the what-if's memory plan and scheduler settings
        (`plan`: num_blocks, page_size, max_batch_tokens, max_requests_per_batch, kv_tokens)
        in this engine's names; `given`: the what-if settings stated by the run (the engine's
        own defaults stand for the rest)."""
        raise ValueError(
            f"the {cls.engine} engine runs on this machine only; the what-if on a chip models "
            f"{', '.join(n for n in modelled() if POLICIES.get(n).on_paper)}"
        )

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

    def saturation_rate(self, info, model, input_len, output_len) -> float:
        """The modelled service capacity (req/s) for requests of these lengths: the largest
        rate the step model drains, analytically (explorer.serving.simulate.rates; one output
        token: one request at a time)."""
        i, o = max(1, int(input_len)), max(1, int(output_len))
        if o < 2:
            return one_at_a_time_rate(info, model, i, o)
        return self.rate(model, shape_of(info), i, o)

    def rate(self, model, shape, i: int, o: int) -> float:
        """This engine's capacity formula for o >= 2 output tokens."""
        raise NotImplementedError


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

    def rate(self, model, shape, i: int, o: int) -> float:
        """One request at a time: 1 / (its prefill + decodes + gaps)."""
        return batch_rate(model, shape, i, o, 1)


@policy("static")
class StaticPolicy(SessionBatch):
    def limits(self) -> tuple[int, float]:
        return self.knobs.max_batch, self.knobs.max_wait_s

    def rate(self, model, shape, i: int, o: int) -> float:
        """Full batches of max_batch: max_batch / (the batch's prefill + decodes + gaps)."""
        return batch_rate(model, shape, i, o, self.knobs.max_batch)


@policy("continuous")
class ContinuousPolicy(Policy):
    paged = on_paper = True
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

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        names = ("num_blocks", "page_size", "max_batch_tokens", "max_requests_per_batch")
        return {k: plan[k] for k in names}

    def rate(self, model, shape, i: int, o: int) -> float:
        """Prefills beside decodes (rates.mixed_rate): as many decoding requests as the KV cache
        holds (blocks x page x (1 - the 15% margin) / (input + output / 2) tokens each) and
        max_requests_per_batch allow, max_batch_tokens per iteration."""
        k = self.knobs
        kv = k.num_blocks * k.page_size * (1 - SAFETY_MARGIN) / (i + o / 2)
        rows = min(kv, k.max_requests_per_batch or 1024)
        return mixed_rate(model, shape, i, o, rows, k.max_batch_tokens)

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
