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

from explorer.serving.engines import Iteration, check_lengths, register

TESTED = "5.25"  # the transformers minor version whose internals the recording reads

# Defaults sized for a laptop; transformers' own defaults size the cache from free memory (on a
# CPU: most of RAM, which made the run 3x slower here) and warm up for CUDA graphs first.
DEFAULTS = {"num_blocks": 256, "page_size": 32, "max_batch_tokens": 256}
SCHEDULERS = ("fifo", "prefill_first")


@register("continuous")
class Continuous:
    def __init__(
        self,
        lm,
        num_blocks: int = DEFAULTS["num_blocks"],
        page_size: int = DEFAULTS["page_size"],
        max_batch_tokens: int = DEFAULTS["max_batch_tokens"],
        max_requests_per_batch: int | None = None,
        scheduler: str = "fifo",
        warmup: bool = False,
        ignore_eos: bool = True,
        record: bool = True,
    ):
        if lm is None:
            raise ValueError("the continuous engine needs a loaded model")
        for name, v, low in (
            ("num_blocks", num_blocks, 1),
            ("page_size", page_size, 4),
            ("max_batch_tokens", max_batch_tokens, 1),
        ):
            if not isinstance(v, int) or v < low:
                raise ValueError(
                    f"continuous engine: {name} must be a whole number >= {low}, got {v!r}"
                )
        if max_requests_per_batch is not None and max_requests_per_batch < 1:
            raise ValueError("continuous engine: max_requests_per_batch must be >= 1")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"continuous engine: scheduler must be one of {', '.join(SCHEDULERS)}")
        self.lm = lm
        self.knobs = {
            "num_blocks": num_blocks,
            "page_size": page_size,
            "max_batch_tokens": max_batch_tokens,
            "max_requests_per_batch": max_requests_per_batch,
            "scheduler": scheduler,
        }
        self.warmup, self.ignore_eos, self.record = warmup, ignore_eos, record

    def describe(self) -> dict:
        import transformers

        return {"engine": "continuous", **self.knobs, "transformers": transformers.__version__}

    def check(self, requests) -> None:
        check_lengths(self.lm, requests)
        check_kv_budget(requests, self.knobs["num_blocks"], self.knobs["page_size"])

    # --- the run ---------------------------------------------------------------------------------

    def configs(self):
        """(GenerationConfig, ContinuousBatchingConfig) built from the knobs."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        k = self.knobs
        cfg = ContinuousBatchingConfig(
            num_blocks=k["num_blocks"],
            page_size=k["page_size"],
            max_batch_tokens=k["max_batch_tokens"],
            max_requests_per_batch=k["max_requests_per_batch"],
            scheduler_type=k["scheduler"],
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
        mgr = self.manager()
        if self.warmup:
            mgr.warmup()
        iterations: list[Iteration] = []
        if self.record:
            _Recorder(mgr, feeder, iterations).attach()
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
        try:
            self._collect(mgr, records, feeder, stop, len(requests))
        finally:
            mgr.stop(block=True, timeout=10)
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
            _fill(self.lm, rec, out, feeder.t0)
            feeder.done(rec)
            finished += 1
        for rec in records.values():
            if rec.end_s is None and rec.error is None:
                rec.error = "stopped before it finished"


def check_kv_budget(requests, num_blocks: int, page_size: int) -> None:
    """A request that can never fit the paged KV budget (also the simulator's check)."""
    budget = num_blocks * page_size
    for r in requests:
        need = len(r.prompt_ids) + r.max_tokens
        if need > budget:
            raise ValueError(
                f"request {r.id} needs {need} KV slots ({len(r.prompt_ids)} prompt + "
                f"{r.max_tokens} new) but the KV budget holds {budget} "
                f"({num_blocks} blocks x {page_size} tokens)"
            )


def _fill(lm, rec, out, t0: float) -> None:
    """A record from the manager's GenerationOutput (its perf_counter clock is ours)."""
    rec.output_ids = list(out.generated_tokens)
    rec.output_len = len(rec.output_ids)
    rec.token_s = [t - t0 for t in (out.timestamps or [])]
    if out.lifespan[0] > 0:
        rec.start_s = out.lifespan[0] - t0
    rec.end_s = (out.lifespan[1] - t0) if out.lifespan[1] > 0 else (rec.token_s or [None])[-1]
    rec.error = out.error
    if lm.tokenizer is not None:
        rec.text = lm.tokenizer.decode(rec.output_ids)


class _Recorder:
    """Wraps the manager's generation step: time it and read the scheduler and cache around it."""

    def __init__(self, mgr, feeder, iterations: list):
        self.mgr, self.feeder, self.iterations = mgr, feeder, iterations
        self.preempted = 0
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
            before = len(processor.scheduler.active_requests)
            done = offload()
            self.preempted += max(0, before - len(processor.scheduler.active_requests))
            return done

        processor.offloading_manager.offload_requests = counted

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


def plain_throughput(lm, requests, **knobs) -> dict:
    """The same requests (all at once) through plain model.generate_batch(), with no recording:
    the reference for what our per-iteration recording costs. Output tokens per second."""
    eng = Continuous(lm, **knobs)
    gen, cfg = eng.configs()
    lm.model.destroy_cached_continuous_batching_manager()
    n = max(r.max_tokens for r in requests)
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
