"""continuous: transformers' own continuous-batching engine, its scheduler recorded per iteration.

The engine is transformers' ContinuousBatchingManager (model.init_continuous_batching(): a paged
KV cache in blocks of page_size tokens, a FIFO or prefill-first scheduler, prompts split into
chunks under max_batch_tokens, requests joining and leaving every iteration, eviction when the
cache is full). We only wrap it: its generation step is timed, and the fields of each Iteration
are read from its own objects (tested with transformers 5.25; the names below are internal):

    decode_requests, prefill_requests, prefill_tokens, batch_tokens
        batch_processor.inputs_and_outputs.requests_in_batch: FutureRequestState.query_length
        (a decoding request has query_length 1; a prefilling one its chunk of the prompt)
    waiting         len(batch_processor.scheduler.waiting_requests)
    kv_blocks_used  cache.num_blocks x (1 - cache.compute_free_capacity())
    preempted       requests that batch_processor.offloading_manager.offload_requests() took out
                    of scheduler.active_requests (offloaded to CPU or reset to recompute)
    passes          [query_length, state.position_offset - query_length] per request (the
                    offset is advanced by the query when the batch is prepared, before the step)
Per request, the manager's own GenerationOutput: lifespan[0] (left the queue) -> start_s,
timestamps (record_timestamps=True, perf_counter after each token) -> token_s, lifespan[1] -> end_s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from explorer._heap import new_objects_only
from explorer.engine.settings import setting
from explorer.serving.engines import Engine, Iteration, Knobs, check_lengths, register

TESTED = "5.25"  # the transformers minor version whose internals the recording reads


# Defaults sized for a laptop; transformers' own defaults size the cache from free memory (on a
# CPU: most of RAM, which made the run 3x slower here) and warm up for CUDA graphs first.
@dataclass
class ContinuousKnobs(Knobs):
    batch_knob, kv_knob = "max_requests_per_batch", "num_blocks"

    num_blocks: int = setting(256, "KV blocks", "paged KV cache size in blocks (the budget)", low=1)
    page_size: int = setting(32, "block tokens", "tokens per KV block", low=4, high=4096)
    max_batch_tokens: int = setting(
        256, "batch tokens", "query tokens per iteration (the prefill chunk limit)", low=1
    )
    max_requests_per_batch: int | None = setting(
        None,
        "max requests",
        "requests per iteration (None: no limit but the tokens)",
        kind=int,
        low=1,
        optional=True,
    )
    scheduler: str = setting(
        "fifo",
        "scheduler",
        "fifo, or prefill_first (prompts before decodes)",
        choices=("fifo", "prefill_first"),
    )

    @property
    def kv_budget(self) -> int:
        """KV slots in the cache (blocks x tokens per block)."""
        return self.num_blocks * self.page_size


@register("continuous", ContinuousKnobs, order=30)
class Continuous(Engine):
    knobs: ContinuousKnobs

    def __init__(
        self,
        lm,
        knobs: ContinuousKnobs,
        *,
        ignore_eos: bool = True,
        record: bool = True,
        warmup: bool = False,
    ):
        """record: time every iteration (off only to measure what recording costs); warmup: run
        transformers' warm-up (CUDA graphs) before the requests."""
        super().__init__(lm, knobs, ignore_eos=ignore_eos)
        self.record, self.warmup = record, warmup

    def describe(self) -> dict:
        import transformers

        return {**super().describe(), "transformers": transformers.__version__}

    def check(self, requests) -> None:
        from explorer.model.memory import check_fits

        check_lengths(self.lm, requests)
        check_kv_budget(requests, self.knobs)
        blocks, page = self.knobs.num_blocks, self.knobs.page_size
        check_fits(
            blocks * page * self.lm.info.kv_bytes_per_token,
            self.lm.device,
            f"the continuous engine's paged KV cache ({blocks:,} blocks x {page} tokens)",
            "give fewer --num-blocks",
        )

    # --- the run ---------------------------------------------------------------------------------

    def configs(self):
        """(GenerationConfig, ContinuousBatchingConfig) built from the knobs."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        k = self.knobs
        cfg = ContinuousBatchingConfig(
            num_blocks=k.num_blocks,
            page_size=k.page_size,
            max_batch_tokens=k.max_batch_tokens,
            max_requests_per_batch=k.max_requests_per_batch,
            scheduler_type=k.scheduler,
        )
        eos = -1 if self.ignore_eos else self.lm.model.config.eos_token_id
        gen = GenerationConfig(do_sample=False, eos_token_id=eos, max_new_tokens=32)
        return gen, cfg

    def manager(self):
        gen, cfg = self.configs()
        self.lm.model.destroy_cached_continuous_batching_manager()
        return self.lm.model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cfg
        )

    def serve(self, requests, records, feeder, stop) -> list:
        """The whole run holds the model's lock: transformers' loop runs on its own thread and
        sets config.is_causal per call, so no other forward may share the model meanwhile."""
        from explorer.model.sharing import exclusive_run

        # transformers collects garbage twice per run (at stop, and when its batch processor is
        # dropped, on return from _serve): inside new_objects_only those walk only the run's objects
        with exclusive_run(self.lm.model), new_objects_only():
            return self._serve(requests, records, feeder, stop)

    def _serve(self, requests, records, feeder, stop) -> list:
        mgr = self.manager()
        if self.warmup:
            mgr.warmup()
        iterations: list[Iteration] = []
        self._recorder = None
        if self.record:
            self._recorder = _Recorder(mgr, feeder, iterations)
            self._recorder.attach()
        mgr.start()
        eos = -1 if self.ignore_eos else None
        sent: dict[str, object] = {}

        def send(req, rec):
            sent[req.id] = rec
            mgr.add_request(
                req.prompt_ids,
                request_id=req.id,
                max_new_tokens=req.max_tokens,
                record_timestamps=True,
                eos_token_id=eos,
            )

        feeder.start(send)
        cut = True  # until _collect returns: a stop, Ctrl-C or an error cuts the run short
        try:
            self._collect(mgr, records, feeder, stop, len(requests))
            cut = stop.is_set()
        finally:
            _stop_manager(mgr, hard=cut)
            self.lm.model.destroy_cached_continuous_batching_manager()
            feeder.join()
        return iterations

    def _collect(self, mgr, records, feeder, stop, n: int) -> None:
        finished = 0
        while finished < n and not stop.is_set():
            out = mgr.get_result(timeout=0.05)
            if out is None:
                if not mgr.is_running():
                    raise RuntimeError(
                        "transformers' continuous-batching loop stopped unexpectedly"
                    )
                if feeder.finished.is_set() and feeder.sent == finished and stop.is_set():
                    break
                continue
            if not out.is_finished():
                continue
            rec = records[out.request_id]
            reset = self._recorder.reset.get(out.request_id) if self._recorder else None
            _fill(self.lm, rec, out, feeder.t0, reset)
            feeder.done(rec)
            finished += 1
        for rec in records.values():
            if rec.end_s is None and rec.error is None:
                rec.error = "stopped before it finished"


def _stop_manager(mgr, hard: bool) -> None:
    """Stop transformers' loop and wait until its thread has really ended (the model's lock is
    released only then). A run cut short stops at once (hard_stop), its unfinished requests
    failed quietly: our records say which were cut, in one line of ours, not one warning each."""
    import logging

    loggers = [logging.getLogger(n) for n in ("ContinuousBatchingLogger", "transformers")]
    levels = [lg.level for lg in loggers]
    if hard:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
    try:
        mgr.stop(block=True, timeout=10, hard_stop=hard)
        while mgr.is_running():
            mgr._generation_thread.join(0.1)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def check_kv_budget(requests, knobs: ContinuousKnobs) -> None:
    """A request that can never fit the paged KV budget (also the simulator's check)."""
    budget = knobs.kv_budget
    for r in requests:
        need = len(r.prompt_ids) + r.max_tokens
        if need > budget:
            raise ValueError(
                f"request {r.id} needs {need} KV slots ({len(r.prompt_ids)} prompt + "
                f"{r.max_tokens} new) but the KV budget holds {budget} "
                f"({knobs.num_blocks} blocks x {knobs.page_size} tokens)"
            )


def _fill(lm, rec, out, t0: float, reset: tuple | None = None) -> None:
    """A record from the manager's GenerationOutput (its perf_counter clock is ours). reset:
    (first start, token times) of a request the engine evicted and reset, whose new state
    restarted its timestamps and lifespan (the earlier tokens are in its output all the same)."""
    rec.output_ids = list(out.generated_tokens)
    rec.output_len = len(rec.output_ids)
    start, before = reset or (out.lifespan[0], [])
    after = out.timestamps or []
    before = before[: max(0, rec.output_len - len(after))]  # a token in flight was discarded
    rec.token_s = [t - t0 for t in [*before, *after]]
    if start > 0:
        rec.start_s = start - t0
    rec.end_s = (out.lifespan[1] - t0) if out.lifespan[1] > 0 else (rec.token_s or [None])[-1]
    rec.error = out.error
    if lm.tokenizer is not None:
        rec.text = lm.tokenizer.decode(rec.output_ids)


class _Recorder:
    """Wraps the manager's generation step: time it and read the scheduler and cache around it."""

    def __init__(self, mgr, feeder, iterations: list):
        self.mgr, self.feeder, self.iterations = mgr, feeder, iterations
        self.preempted = 0
        self.reset: dict[str, tuple] = {}  # request id -> (first start, token times before reset)
        self._processor = None

    def attach(self) -> None:
        step = self.mgr._generation_step

        def recorded_step():
            processor = self.mgr.batch_processor
            if processor is not self._processor:
                self._watch(processor)
            batch = list(processor.inputs_and_outputs.requests_in_batch)
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            self._note(processor, batch, t0, t1)

        self.mgr._generation_step = recorded_step

    def _watch(self, processor) -> None:
        """Count evictions: offload_requests() removes requests from the active set."""
        self._processor = processor
        offload = processor.offloading_manager.offload_requests

        def counted():
            active = dict(processor.scheduler.active_requests)
            kept = {rid: (s.lifespan[0], list(s._timestamps)) for rid, s in active.items()}
            done = offload()
            self.preempted += max(0, len(active) - len(processor.scheduler.active_requests))
            self._note_resets(processor.scheduler, active, kept)
            return done

        processor.offloading_manager.offload_requests = counted

    def _note_resets(self, scheduler, active: dict, kept: dict) -> None:
        """A soft-reset request comes back as a new state (timestamps and lifespan restarted):
        keep its first start and the token times it had, for its record."""
        for rid, old in active.items():
            new = scheduler.waiting_requests.get(rid)
            if new is not None and new is not old:
                start, times = self.reset.get(rid, (kept[rid][0], []))
                self.reset[rid] = (start, times + kept[rid][1])

    def _note(self, processor, batch, t0: float, t1: float) -> None:
        q = [f.query_length for f in batch]
        decode = sum(1 for f in batch if f.query_length == 1 and f.state.generated_len() > 0)
        cache = processor.cache
        t = self.feeder.t0
        self.iterations.append(
            Iteration(
                index=len(self.iterations),
                start_s=t0 - t,
                end_s=t1 - t,
                decode_requests=decode,
                prefill_requests=len(batch) - decode,
                prefill_tokens=sum(q) - decode,
                batch_tokens=sum(q),
                waiting=len(processor.scheduler.waiting_requests),
                kv_blocks_used=round(cache.num_blocks * (1 - cache.compute_free_capacity())),
                kv_blocks_total=cache.num_blocks,
                preempted=self.preempted,
                # position_offset was advanced by the query when the batch was prepared
                passes=[[f.query_length, f.state.position_offset - f.query_length] for f in batch],
            )
        )
        self.preempted = 0


def plain_throughput(lm, requests, knobs: ContinuousKnobs) -> dict:
    """The same requests (all at once) through plain model.generate_batch(), with no recording:
    the reference for what our per-iteration recording costs. Output tokens per second."""
    from explorer.model.sharing import exclusive_run

    eng = Continuous(lm, knobs)
    gen, cfg = eng.configs()
    n = max(r.max_tokens for r in requests)
    with exclusive_run(lm.model), new_objects_only():  # as the recorded run collects garbage
        lm.model.destroy_cached_continuous_batching_manager()
        t0 = time.perf_counter()
        out = lm.model.generate_batch(
            [r.prompt_ids for r in requests],
            generation_config=gen,
            continuous_batching_config=cfg,
            warmup=eng.warmup,
            max_new_tokens=n,
        )
        seconds = time.perf_counter() - t0
    tokens = sum(len(o.generated_tokens) for o in out.values())
    return {"seconds": seconds, "output_tokens": tokens, "output_throughput": tokens / seconds}
