"""The discrete-event loop: a workload's requests through one simulated engine, on a plain heap.

The events: a request arrives (the feeder sends it, behind max_concurrency as the real
Feeder does) and an iteration ends (its tokens land, finished requests leave, the engine plans
the next one); the static engine adds a wake-up at its batch's wait limit, and no iteration
starts before the engine's measured start-up time. What runs next is the engine's policy's
choice (explorer.serving.simulate.policy: one class per engine). The engine is one
server: an iteration's length is the StepModel's seconds for its passes, plus the measured gap
between iterations. The result is the serving lab's own records and iterations, so every view
and summarise() read a simulated run exactly as a measured one.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools

from explorer._heap import new_objects_only
from explorer.serving.engines import Iteration
from explorer.serving.metrics import RequestRecord
from explorer.serving.simulate.policy import Plan, Policy, SimRequest


class Simulator:
    def __init__(self, policy: Policy, shape, step_model, max_concurrency=None):
        self.policy, self.shape, self.model = policy, shape, step_model
        self.max_concurrency = max_concurrency
        self.heap: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.waiting: list[SimRequest] = []  # sent, not running
        self.running: list[SimRequest] = []
        self.backlog: list[SimRequest] = []  # arrived, held back by max_concurrency
        self.in_flight = 0
        self.busy = False
        self.iterations: list[Iteration] = []
        self.unsent = 0

    # --- events ------------------------------------------------------------------------------

    def push(self, t: float, kind: str, payload=None) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def run(self, requests: list[SimRequest]) -> list[Iteration]:
        # a run makes ~10^5-10^6 objects that live until it ends: the collector's automatic full
        # passes walked the whole process each time (half a long run's time beside the dashboard)
        with new_objects_only():
            return self._run(requests)

    def _run(self, requests: list[SimRequest]) -> list[Iteration]:
        self.unsent = len(requests)
        for r in requests:
            self.push(r.arrival_s, "arrive", r)
        while self.heap:
            self.now = self.heap[0][0]
            while self.heap and self.heap[0][0] <= self.now:  # everything due now, then plan
                _, _, kind, payload = heapq.heappop(self.heap)
                if kind == "arrive":
                    self.arrive(payload)
                elif kind == "done":
                    self.finish_iteration(payload)
            self.maybe_start()
        return self.iterations

    def arrive(self, req: SimRequest) -> None:
        self.backlog.append(req)
        self.send_backlog()

    def send_backlog(self) -> None:
        """Send arrived requests while a concurrency slot is free (the real Feeder's rule)."""
        while self.backlog and (
            self.max_concurrency is None or self.in_flight < self.max_concurrency
        ):
            req = self.backlog.pop(0)
            req.sent_s = self.now
            req.prefill_left = req.input_len
            self.in_flight += 1
            self.unsent -= 1
            self.waiting.append(req)

    @property
    def more_coming(self) -> bool:
        return self.unsent > 0

    # --- iterations --------------------------------------------------------------------------

    def maybe_start(self) -> None:
        if self.busy:
            return
        if self.now < self.model.startup_s:  # the engine is still starting
            self.push(self.model.startup_s, "wake")
            return
        plan = self.plan()
        if plan is None or not plan.rows:
            return
        steps = [plan.passes, *plan.more]  # more: multi-step scheduling's further steps
        seconds = sum(self.model.seconds(self.shape, p) + self.model.gap_s for p in steps)
        self.busy = True
        for req, _ in plan.rows:
            if req.start_s is None:
                req.start_s = self.now
        self.push(self.now + seconds, "done", (plan, self.now, seconds))

    def plan(self) -> Plan | None:
        return self.policy.plan(self)

    def finish_iteration(self, payload) -> None:
        plan, start, seconds = payload
        self.busy = False
        end = start + seconds
        decode = prefill = prefill_tokens = 0
        for req, q in plan.rows:
            if req.done:  # a static batch's finished row still computes (padding)
                continue
            if req.decoding:
                decode += 1
            else:
                prefill, prefill_tokens = prefill + 1, prefill_tokens + q
            req.cached += q
            req.prefill_left = max(0, req.prefill_left - q)
            if req.prefill_left == 0:
                burst = 1 + min(len(plan.more), req.max_tokens - len(req.token_s) - 1)
                req.token_s.extend([end] * burst)
                req.cached += burst - 1
                if req.done:
                    req.end_s = end
                    self.leave(req)
        self.record(plan, start, end, (decode, prefill, prefill_tokens))
        self.policy.finished(plan)

    def leave(self, req: SimRequest) -> None:
        if req in self.running:
            self.running.remove(req)
            req.blocks = 0
        self.in_flight -= 1
        self.send_backlog()

    def record(self, plan: Plan, start: float, end: float, counts: tuple[int, int, int]) -> None:
        decode, prefill, prefill_tokens = counts
        paged = self.policy.paged
        self.iterations.append(
            Iteration(
                index=len(self.iterations),
                start_s=start,
                end_s=end,
                decode_requests=decode,
                prefill_requests=prefill,
                prefill_tokens=prefill_tokens,
                batch_tokens=sum(q for q, _ in plan.passes),
                waiting=len(self.waiting),
                kv_blocks_used=sum(r.blocks for r in self.running) if paged else None,
                kv_blocks_total=self.policy.kv_blocks_total,
                preempted=plan.preempted,
                passes=plan.passes,  # frozen when planned (Plan): no copy per iteration
            )
        )


def to_records(reqs: list[SimRequest]) -> list[RequestRecord]:
    """Plain serving-lab records (no token ids or text: nothing was generated)."""
    names = [f.name for f in dataclasses.fields(RequestRecord)]
    out = []
    for r in reqs:
        rec = RequestRecord(**{n: getattr(r, n) for n in names})
        rec.token_s = list(r.token_s)
        rec.output_len = len(r.token_s)
        if r.end_s is None:
            rec.error = "did not finish in the simulation"
        out.append(rec)
    return out
