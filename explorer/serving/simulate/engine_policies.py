"""The schedulers of the serving engines the published runs used, one policy class each, in the
simulator's one policy registry (explorer.serving.simulate.policy.POLICIES), built from the
knobs of explorer.serving.simulate.engine_knobs (each engine's own defaults).

Every one schedules the iteration the chip machine then times: a step with prefill and decode
rows is costed as one fused GEMM over all its tokens plus separate attention (chip.py), so
none of them has a step model of its own. What each copies, and what it leaves out, is in its
class docstring; all leave out prefix caching (the published runs disabled it, or used prompts
that share no prefix), speculative decoding and CPU swap space.
"""

from __future__ import annotations

import math

from explorer.costs.hardware import chip_named
from explorer.serving.simulate.engine_knobs import (
    SglangKnobs,
    TrtllmKnobs,
    VllmKnobs,
    VllmV0Knobs,
    vllm_defaults,
)
from explorer.serving.simulate.policy import (
    Plan,
    Policy,
    SimRequest,
    blocks_needed,
    policy,
    query_of,
)
from explorer.serving.simulate.rates import mixed_rate, split_rate

CLIP_MAX_NEW_TOKENS = 4096  # SGLang's schedule_policy.py: new tokens reserved per request at most


def reset(req: SimRequest, keep_page: int = 0) -> None:
    """Preempted by recompute: its blocks freed, its prompt and the tokens it had recomputed
    (keep_page: with a prefix cache of blocks of that many tokens, its full blocks stay cached
    when freed and are found again when it is rescheduled: only the rest is recomputed)."""
    kept = (req.cached // keep_page) * keep_page if keep_page else 0
    req.prefill_left = req.input_len + len(req.token_s) - kept
    req.cached, req.blocks = kept, 0
    req.preemptions += 1


def take(rows: list, req: SimRequest, q: int, need: int) -> int:
    """Schedule `q` tokens of `req` holding `need` more blocks; the blocks it took."""
    req.blocks += need
    rows.append((req, q))
    return need


def refuse_longer(requests, tokens: int, budget: str) -> None:
    """A scheduler that cannot chunk a prompt cannot serve one longer than its per-step token
    budget: the first such request refused, in one line (`budget` says which budget)."""
    for r in requests:
        if len(r.prompt_ids) > tokens:
            raise ValueError(
                f"request {r.id}: its {len(r.prompt_ids)}-token prompt is longer than {budget}"
            )


def admit_in_order(sim, rows, free: int, budget: int, max_running: int, chunked: bool, blocks_for):
    """Waiting requests in arrival order while max_running, the token budget and the free KV
    blocks allow; the first that does not fit stops the queue (FCFS). A prompt longer than the
    budget left is cut to it when `chunked`, else it waits. blocks_for(req, q): the new blocks
    the request must hold to run q tokens (vLLM: what q needs; TensorRT-LLM's no-evict: its
    whole length). The admitted requests; their rows are appended to `rows`."""
    admitted: list[SimRequest] = []
    for req in sim.waiting:
        if len(sim.running) + len(admitted) >= max_running or budget <= 0:
            break
        q = req.prefill_left
        if q > budget:
            if not chunked:
                break
            q = budget
        need = blocks_for(req, q)
        if need > free:
            break
        free -= take(rows, req, q, need)
        budget -= q
        admitted.append(req)
    return admitted


def admit(sim, admitted: list[SimRequest]) -> None:
    """Move admitted requests from waiting to running (one pass over the waiting list)."""
    if admitted:
        ids = {id(r) for r in admitted}
        sim.running.extend(admitted)
        sim.waiting = [r for r in sim.waiting if id(r) not in ids]


def requeue_front(sim, preempted: list[SimRequest]) -> None:
    """Preempted requests go back to the front of the waiting queue, the oldest first."""
    if preempted:
        sim.waiting[:0] = list(reversed(preempted))


def used_blocks(sim) -> int:
    return sum(r.blocks for r in sim.running)


def fit_running(sim, page: int, free: int, budget: int, limit: int | None = None, keep=0):
    """vLLM V1's first loop (and TensorRT-LLM's max_utilization): the running requests in order
    (decodes and partial prefills; a prefill chunked to the budget left), each taking the blocks
    its tokens need; when blocks run out the newest running request is preempted (recompute;
    keep: its full blocks found again in the prefix cache, reset()) until the request fits or
    is itself the newest. (rows, preempted, free, budget)."""
    rows, preempted, running, i = [], [], sim.running, 0
    while i < len(running) and budget > 0 and (limit is None or len(rows) < limit):
        req = running[i]
        q = min(query_of(req), budget)
        need = blocks_needed(req, q, page)
        while need > free and running[-1] is not req:
            victim = running.pop()
            free += victim.blocks
            reset(victim, keep)
            preempted.append(victim)
        if need > free:  # the request is the newest itself: preempted
            running.pop()
            free += req.blocks
            reset(req, keep)
            preempted.append(req)
            break
        free -= take(rows, req, q, need)
        budget -= q
        i += 1
    return rows, preempted, free, budget


def check_fits(requests, blocks: int, page: int, engine: str) -> None:
    """Refuse a request whose prompt and output could never be in the KV cache at once (vLLM
    refuses such a max_model_len at start-up; here the run would preempt itself forever)."""
    for r in requests:
        need = math.ceil((len(r.prompt_ids) + r.max_tokens) / page)
        if need > blocks:
            raise ValueError(
                f"request {r.id} needs {need:,} KV blocks of {page} tokens, more than the "
                f"{engine} cache's {blocks:,}"
            )


def paper_blocks(plan: dict, page: int) -> int:
    """KV blocks of `page` tokens the memory plan's KV token slots hold."""
    return max(1, plan["kv_tokens"] // page)


@policy("vllm")
class VllmPolicy(Policy):
    """vLLM V1's scheduler (the default engine from vLLM 0.8; copied from
    vllm/v1/core/sched/scheduler.py, Scheduler.schedule(), v0.8-v0.11): one token budget per
    step (max_num_batched_tokens); the running requests first, in order, each a decode token or
    the next chunk of its prompt; then waiting requests in FCFS order while the budget,
    max_num_seqs and free KV blocks allow, the last prompt chunked to the budget left
    (enable_chunked_prefill); a waiting request that gets no blocks stops admission (the head of
    the queue blocks it). When a running request needs a block and none is free, the newest
    running request is preempted by recompute (its blocks freed, back at the front of the
    waiting queue) and no waiting request is admitted in that step. With prefix caching on
    (V1's default; vllm/v1/core/kv_cache_manager.py, block_pool.py), freed blocks stay cached,
    so a preempted request finds its full computed blocks again when rescheduled and recomputes
    only the rest: the stated simplification is that they are never evicted in between (and
    that prompts share no prefix with each other, as the published runs' prompts do not).
    Not modelled: long_prefill_token_threshold, async scheduling, priorities."""

    Knobs = VllmKnobs
    order = 40
    paged = on_paper = True
    assumption = (
        "scheduler: vLLM V1 (token budget per step; running requests first, then waiting in "
        "FCFS order, the last prompt chunked; preemption of the newest by recompute)"
    )

    @property
    def kv_blocks_total(self) -> int:
        return self.knobs.num_gpu_blocks

    def check(self, requests) -> None:
        check_fits(requests, self.knobs.num_gpu_blocks, self.knobs.block_size, "vllm")

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        out = vllm_defaults(chip_named(plan["chip"]))
        if "max_batch_tokens" in given:
            out["max_num_batched_tokens"] = given["max_batch_tokens"]
        if "max_batch" in given:
            out["max_num_seqs"] = given["max_batch"]
        return {**out, "block_size": plan["page_size"], "num_gpu_blocks": plan["num_blocks"]}

    def plan(self, sim) -> Plan | None:
        k = self.knobs
        free = k.num_gpu_blocks - used_blocks(sim)
        budget, keep = k.max_num_batched_tokens, k.block_size if k.enable_prefix_caching else 0
        rows, preempted, free, budget = fit_running(sim, k.block_size, free, budget, keep=keep)
        requeue_front(sim, preempted)
        if not preempted:
            admit(sim, self.admit_waiting(sim, rows, free, budget))
        return Plan.of(rows, preempted=len(preempted))

    def admit_waiting(self, sim, rows, free: int, budget: int) -> list[SimRequest]:
        k = self.knobs
        return admit_in_order(
            sim, rows, free, budget, k.max_num_seqs, k.enable_chunked_prefill,
            lambda req, q: blocks_needed(req, q, k.block_size),
        )  # fmt: skip

    def rate(self, model, shape, i: int, o: int) -> float:
        """Prefills beside decodes (rates.mixed_rate): as many running requests as the KV blocks
        hold (at input + output / 2 tokens each) and max_num_seqs allow, the token budget per
        step."""
        k = self.knobs
        rows = min(k.num_gpu_blocks * k.block_size / (i + o / 2), k.max_num_seqs)
        return mixed_rate(model, shape, i, o, rows, k.max_num_batched_tokens)


def burst_passes(rows, steps: int) -> list[list[list[int]]]:
    """The passes of multi-step scheduling's steps 2..N: each decoding row decodes on while it
    still has tokens to give ([1 query token, its past])."""
    more = []
    for j in range(1, steps):
        more.append(
            [
                [1, r.cached + q + j - 1]
                for r, q in rows
                if q >= r.prefill_left and j < r.max_tokens - len(r.token_s)
            ]
        )
    return [p for p in more if p]


@policy("vllm-v0")
class VllmV0Policy(Policy):
    """vLLM V0's default scheduler, as the older published runs (vLLM 0.6.0, source S1) ran it
    (copied from vllm/core/scheduler.py, Scheduler._schedule_default(), v0.6.0): without chunked
    prefill, waiting prompts are taken whole in FCFS order while the token budget
    (max_num_batched_tokens), max_num_seqs and the free blocks (less a 1% watermark) allow, and
    a step that has any prefill runs prefills only; otherwise every running request decodes, and
    a request that cannot get its next block preempts the newest running one by recompute (back
    at the front of the waiting queue). Multi-step scheduling (--num-scheduler-steps N,
    vllm/engine/llm_engine.py + worker/multi_step_model_runner.py): a decode batch runs N steps
    before the scheduler runs again, with blocks for the N tokens taken up front, and the tokens
    of the N steps reach the client together when the last step ends (the inter-token times
    come in bursts; TPOT, the mean per token, is unchanged by that); a prompt that arrives
    meanwhile waits for the batch's last step, so TTFT includes that wait. A prefill batch runs
    one step (0.6.0 ran multi-step for decodes only: chunked prefill with multi-step came
    later), its first tokens landing when it ends. With enable_chunked_prefill (vLLM 0.6 turns
    it on by itself for a max_model_len above 32K: EngineArgs.create_engine_config,
    use_long_context), Scheduler._schedule_chunked_prefill() instead: the running requests
    first (decodes and the next chunks of partial prompts), then waiting prompts in FCFS order,
    the last chunked to the token budget left, all in one step (multi-step is not combined with
    it here: 0.6 refused the two together). Not modelled: swap space (preemption is recompute),
    the delay factor."""

    Knobs = VllmV0Knobs
    order = 45
    paged = on_paper = True
    WATERMARK = 0.01  # vLLM V0 CacheConfig: free blocks kept back when admitting a prompt
    assumption = (
        "scheduler: vLLM V0 (prefill-only steps before decode steps, whole prompts under the "
        "token budget; multi-step: N decode steps per schedule, tokens in bursts of N)"
    )

    @property
    def kv_blocks_total(self) -> int:
        return self.knobs.num_gpu_blocks

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        out = {
            "max_num_batched_tokens": given.get("max_batch_tokens", 2048),
            "max_num_seqs": given.get("max_batch", 256),
        }
        return {**out, "block_size": plan["page_size"], "num_gpu_blocks": plan["num_blocks"]}

    def check(self, requests) -> None:
        k = self.knobs
        check_fits(requests, k.num_gpu_blocks, k.block_size, "vllm-v0")
        if not k.enable_chunked_prefill:
            budget = f"the vllm-v0 token budget ({k.max_num_batched_tokens}, no chunked prefill)"
            refuse_longer(requests, k.max_num_batched_tokens, budget)

    def plan(self, sim) -> Plan | None:
        k = self.knobs
        if k.enable_chunked_prefill:
            return self.chunked_plan(sim)
        steps, free = k.num_scheduler_steps, k.num_gpu_blocks - used_blocks(sim)
        rows = self.prefills(sim, free)
        if rows:
            return Plan.of(rows)
        rows, preempted = self.decodes(sim, free, steps)
        requeue_front(sim, preempted)
        plan = Plan.of(rows, preempted=len(preempted))
        plan.more = burst_passes(rows, steps)
        return plan

    def chunked_plan(self, sim) -> Plan:
        """_schedule_chunked_prefill(): running first, then waiting prompts, the last chunked."""
        k = self.knobs
        free = k.num_gpu_blocks - used_blocks(sim)
        rows, preempted, free, budget = fit_running(
            sim, k.block_size, free, k.max_num_batched_tokens
        )
        requeue_front(sim, preempted)
        admitted = admit_in_order(
            sim, rows, free, budget, k.max_num_seqs, True,
            lambda req, q: blocks_needed(req, q, k.block_size),
        )  # fmt: skip
        admit(sim, admitted)
        return Plan.of(rows, preempted=len(preempted))

    def prefills(self, sim, free: int) -> list:
        k, rows, admitted = self.knobs, [], []
        budget, keep = k.max_num_batched_tokens, self.WATERMARK * k.num_gpu_blocks
        for req in sim.waiting:
            q = req.prefill_left
            if len(sim.running) + len(admitted) >= k.max_num_seqs or q > budget:
                break
            need = blocks_needed(req, q, k.block_size)
            if free - need < keep:
                break
            free -= take(rows, req, q, need)
            budget -= q
            admitted.append(req)
        admit(sim, admitted)
        return rows

    def decodes(self, sim, free: int, steps: int):
        """Every running request's next N tokens; the newest preempted while blocks lack."""
        rows, preempted, running, i, page = [], [], sim.running, 0, self.knobs.block_size
        while i < len(running):
            req = running[i]
            need = blocks_needed(req, steps, page)
            while need > free and running[-1] is not req:
                victim = running.pop()
                free += victim.blocks
                reset(victim)
                preempted.append(victim)
            if need > free:
                running.pop()
                free += req.blocks
                reset(req)
                preempted.append(req)
                break
            free -= take(rows, req, 1, need)
            i += 1
        return rows, preempted

    def rate(self, model, shape, i: int, o: int) -> float:
        """Prefill steps apart from decode steps (rates.split_rate; with chunked prefill
        rates.mixed_rate): as many running requests
        as the KV blocks hold (input + output / 2 tokens each) and max_num_seqs allow (multi-step
        changes when tokens reach the client, not how many steps run)."""
        k = self.knobs
        rows = min(k.num_gpu_blocks * k.block_size / (i + o / 2), k.max_num_seqs)
        rate = mixed_rate if k.enable_chunked_prefill else split_rate
        return rate(model, shape, i, o, rows, k.max_num_batched_tokens)


@policy("sglang")
class SglangPolicy(Policy):
    """SGLang's scheduler, 0.3-era (copied from python/sglang/srt/managers/scheduler.py,
    get_next_batch_to_run() / get_new_prefill_batch() / update_running_batch(), and
    schedule_policy.py PrefillAdder, v0.3.0): prefill first. Whenever waiting requests fit, a
    prefill batch is formed and run alone (no decode rows in it): the request being chunked
    first, then waiting ones in FCFS order (the radix cache off, as in the published runs),
    while the prompt tokens stay under max_prefill_tokens (one request may go past it alone),
    the running count under max_running_requests, and each new request's prompt plus its
    output (at most 4,096) fits the KV token slots left after the running requests' remaining
    outputs are reserved at new_token_ratio; a prompt longer than the chunk left
    (chunked_prefill_size) is cut there and finished in later prefill batches. Otherwise the
    running requests decode one token each; when the KV pool lacks a slot per request, the
    request with the fewest output tokens is retracted (recomputed later, at the front of the
    queue) and new_token_ratio goes back to its start. The stated simplification: the ratio
    starts at 0.7 x schedule_conservativeness and falls by 0.001 per decode step to 0.1 x it
    (global_config.py), without SGLang's re-estimate from the decoded tokens after a retract.
    Not modelled: the radix (prefix) cache, mixed chunks (--enable-mixed-chunk, off by
    default), the overlap scheduler of later versions."""

    Knobs = SglangKnobs
    order = 50
    paged = on_paper = True
    INIT_RATIO, MIN_RATIO, DECAY = 0.7, 0.1, 0.001
    assumption = (
        "scheduler: SGLang (prefill batches first, alone, under max_prefill_tokens and the "
        "conservative KV reservation; then decode; chunked prefill; retract on a full pool)"
    )

    def __init__(self, knobs: SglangKnobs):
        super().__init__(knobs)
        c = knobs.schedule_conservativeness
        self.ratio = self.start_ratio = min(1.0, self.INIT_RATIO * c)
        self.min_ratio = min(1.0, self.MIN_RATIO * c)

    @property
    def kv_blocks_total(self) -> int:
        return self.knobs.max_total_tokens

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        out = {"max_total_tokens": plan["kv_tokens"]}
        if "max_batch" in given:
            out["max_running_requests"] = given["max_batch"]
        if "max_batch_tokens" in given:
            out["chunked_prefill_size"] = given["max_batch_tokens"]
        return out

    def check(self, requests) -> None:
        slots = self.knobs.max_total_tokens
        for r in requests:
            if len(r.prompt_ids) + min(r.max_tokens, CLIP_MAX_NEW_TOKENS) > slots:
                raise ValueError(
                    f"request {r.id}: its prompt and output ({len(r.prompt_ids)} + "
                    f"{r.max_tokens} tokens) do not fit SGLang's {slots:,} KV token slots"
                )

    def plan(self, sim) -> Plan | None:
        rows = self.prefill_batch(sim)
        if rows:
            return Plan.of(rows)
        return self.decode_batch(sim)

    def reserved(self, sim) -> float:
        """KV slots kept for the running requests' remaining outputs (x new_token_ratio)."""
        left = (min(r.max_tokens - len(r.token_s), CLIP_MAX_NEW_TOKENS) for r in sim.running)
        return sum(left) * self.ratio

    def prefill_batch(self, sim) -> list:
        k = self.knobs
        rem_total = k.max_total_tokens - used_blocks(sim) - self.reserved(sim)
        rem_input, rem_chunk = k.max_prefill_tokens, k.chunked_prefill_size or math.inf
        chunking = [r for r in sim.running if r.prefill_left > 0]
        rows, admitted = [], []
        for req in chunking + sim.waiting:
            new = req not in chunking
            q = req.prefill_left
            if new and len(sim.running) + len(admitted) >= k.running_limit:
                break
            out = min(req.max_tokens - len(req.token_s), CLIP_MAX_NEW_TOKENS) if new else 0
            if q + out > rem_total or (rows and q > rem_input) or rem_chunk <= 0:
                break
            q = int(min(q, rem_chunk))
            rem_total -= take(rows, req, q, q) + out
            rem_input, rem_chunk = rem_input - q, rem_chunk - q
            if new:
                admitted.append(req)
            if q < req.prefill_left:  # chunked: the rest in a later prefill batch
                break
        admit(sim, admitted)
        return rows

    def decode_batch(self, sim) -> Plan:
        free = self.knobs.max_total_tokens - used_blocks(sim)
        decoding = [r for r in sim.running if r.prefill_left == 0]
        retracted = []
        while len(decoding) > free and len(decoding) > 1:
            victim = min(decoding, key=lambda r: (len(r.token_s), -r.input_len))
            decoding.remove(victim)
            sim.running.remove(victim)
            free += victim.blocks
            reset(victim)
            retracted.append(victim)
        requeue_front(sim, retracted)
        if retracted:
            self.ratio = self.start_ratio
        else:
            self.ratio = max(self.ratio - self.DECAY, self.min_ratio)
        rows = []
        for req in decoding:
            take(rows, req, 1, 1)
        return Plan.of(rows, preempted=len(retracted))

    def rate(self, model, shape, i: int, o: int) -> float:
        """Prefill batches apart from decode steps (rates.split_rate): as many running requests
        as the KV slots hold (input + output / 2 each) and max_running_requests allow, prompts
        per prefill batch under max_prefill_tokens."""
        k = self.knobs
        rows = min(k.max_total_tokens / (i + o / 2), k.running_limit)
        return split_rate(model, shape, i, o, rows, k.max_prefill_tokens)


@policy("trtllm")
class TrtllmPolicy(Policy):
    """TensorRT-LLM's inflight batching (copied from the PyTorch backend's scheduler,
    tensorrt_llm/_torch/pyexecutor/scheduler.py: a capacity scheduler, then a micro-batch
    scheduler, v1.0; docs/source/torch/scheduler.md and the tuning guide's max_batch_size /
    max_num_tokens section): each iteration the started requests come first (a decode token, or
    the next context chunk), then new requests in arrival order, while max_batch_size requests
    and max_num_tokens tokens allow; a context that does not fit the tokens left waits for a
    later iteration unless context chunking is on (off by default). The capacity policy
    GUARANTEED_NO_EVICT (the default) starts a request only when blocks for its whole length
    (prompt + max_tokens) are free beside the ones started requests hold to their ends, so no
    request is ever paused; MAX_UTILIZATION takes blocks as tokens need them and pauses the
    newest request (recomputed later) when they run out. Not modelled: KV block reuse, the
    CUDA-graph padding of the batch, the overlap scheduler."""

    Knobs = TrtllmKnobs
    order = 60
    paged = on_paper = True
    assumption = (
        "scheduler: TensorRT-LLM inflight batching (started requests, then new ones in arrival "
        "order, under max_num_tokens and max_batch_size; guaranteed-no-evict KV reservation)"
    )

    @property
    def kv_blocks_total(self) -> int:
        return self.knobs.num_kv_blocks

    @property
    def no_evict(self) -> bool:
        return self.knobs.capacity_scheduler_policy == "guaranteed_no_evict"

    @classmethod
    def paper_knobs(cls, plan: dict, given: dict) -> dict:
        out = {"num_kv_blocks": paper_blocks(plan, TrtllmKnobs.tokens_per_block)}
        if "max_batch_tokens" in given:
            out["max_num_tokens"] = given["max_batch_tokens"]
        if "max_batch" in given:
            out["max_batch_size"] = given["max_batch"]
        return out

    def check(self, requests) -> None:
        k = self.knobs
        for r in requests:
            whole = math.ceil((len(r.prompt_ids) + r.max_tokens) / k.tokens_per_block)
            if whole > k.num_kv_blocks:
                raise ValueError(
                    f"request {r.id} needs {whole} KV blocks, more than TensorRT-LLM's "
                    f"{k.num_kv_blocks}"
                )
        if not k.enable_chunked_prefill:
            budget = f"max_num_tokens ({k.max_num_tokens}) and context chunking is off"
            refuse_longer(requests, k.max_num_tokens, budget)

    def plan(self, sim) -> Plan | None:
        k = self.knobs
        free = k.num_kv_blocks - used_blocks(sim)
        if self.no_evict:
            rows, preempted, budget = self.started(sim), [], k.max_num_tokens
            budget -= sum(q for _, q in rows)
        else:
            page, limit = k.tokens_per_block, k.max_batch_size
            rows, preempted, free, budget = fit_running(sim, page, free, k.max_num_tokens, limit)
            requeue_front(sim, preempted)
        admit(sim, self.new_contexts(sim, rows, free, budget))
        return Plan.of(rows, preempted=len(preempted))

    def started(self, sim) -> list:
        """The started requests' rows under the token budget (their blocks already held)."""
        k, rows, budget = self.knobs, [], self.knobs.max_num_tokens
        for req in sim.running[: k.max_batch_size]:
            q = query_of(req)
            if q > budget:
                if not k.enable_chunked_prefill or req.prefill_left == 0:
                    continue
                q = budget
            if q <= 0:
                break
            rows.append((req, q))
            budget -= q
        return rows

    def new_contexts(self, sim, rows, free: int, budget: int) -> list[SimRequest]:
        k, page = self.knobs, self.knobs.tokens_per_block

        def blocks_for(req, q: int) -> int:  # guaranteed-no-evict: the whole length up front
            whole = req.input_len + req.max_tokens if self.no_evict else req.cached + q
            return max(0, math.ceil(whole / page) - req.blocks)

        return admit_in_order(
            sim, rows, free, budget, k.max_batch_size, k.enable_chunked_prefill, blocks_for
        )

    def rate(self, model, shape, i: int, o: int) -> float:
        """Contexts beside decodes (rates.mixed_rate): as many requests as the KV blocks hold
        at their whole length (input + output each, guaranteed-no-evict; input + output / 2
        under max_utilization) and max_batch_size allow, max_num_tokens per iteration."""
        k = self.knobs
        per = i + o if self.no_evict else i + o / 2
        rows = min(k.num_kv_blocks * k.tokens_per_block / per, k.max_batch_size)
        return mixed_rate(model, shape, i, o, rows, k.max_num_tokens)


def chip_knobs(engine: str, extra: dict, chip: str, given: dict | None = None) -> dict:
    """The knobs of `engine` on a chip on paper: whatif.chip_model's memory plan (`extra`) in
    the engine's names, its own defaults for the rest; `given`: the what-if settings the run
    states (max_batch_tokens, max_batch, page_size), which override the engine's defaults."""
    from explorer.serving.simulate.policy import policy_class

    plan = {**extra["knobs"], "kv_tokens": extra["memory"]["kv_tokens"], "chip": chip}
    return policy_class(engine).paper_knobs(plan, dict(given or {}))
