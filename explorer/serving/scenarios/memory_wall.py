"""memory-wall: batch x context grows until the KV cache no longer fits a memory budget.

The cost model predicts the batch that fails: the continuous engine allocates its paged KV cache
up front, num_blocks x page_size x kv_bytes_per_token bytes (plus two spare blocks it keeps), and
a server sizes num_blocks to hold batch x context (the model counts the cache alone: what a pass
needs besides is the gap the run shows). The run then finds the real failing batch, starting
at the prediction and stepping away from it, then bisecting: each batch is served in a child
forked from a freshly spawned probe server that holds the model (ProbeServer: the same clean heap
whatever the caller did before), the child's data segment capped
by resource.setrlimit(RLIMIT_DATA) at its size at the fork plus the budget (one torch thread,
small thread stacks, and every allocation above 64 KiB in a fresh mapping in the child, so only
the run spends the budget). A child that runs out gets
the allocator's MemoryError and reports it; one that dies or hangs is reported by its exit; this
process never spends the budget and stays alive. CPU only (a forked child cannot use CUDA).

broken  the smallest batch that failed (its requests carry the out-of-memory error)
fixed   the largest batch that fitted (the fix: a batch the budget holds, or a bigger budget)
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import time

from explorer.serving.metrics import RequestRecord, summarise
from explorer.serving.run import ServingResult, run_meta, serve
from explorer.serving.scenarios import Scenario, register
from explorer.serving.scenarios._figures import headline
from explorer.serving.workload import Workload

DEFAULT_BUDGET_GB = 0.012
SIZES = {
    "input_len": 60,
    "output_len": 4,
    "page_size": 16,
    "max_batch_tokens": 128,
    "budget_gb": DEFAULT_BUDGET_GB,
}
# a smaller budget: the wall at a small batch, each probe a short run
SMALL = {**SIZES, "budget_gb": 0.005}
MIN_BUDGET_GB = 0.002  # below it a child's own allocations hit the cap before the cache does
CHILD_TIMEOUT_S = 60.0
SERVER_START_S = 120.0  # the spawned probe server's imports and model load, on a busy machine
GIVE_UP = 4  # no failure up to this many times the predicted batch: the model is off


def cache_bytes(batch: int, info, sizes: dict = SIZES) -> int:
    """The paged KV cache a server sizes for `batch` requests of the full context (modelled)."""
    page = sizes["page_size"]
    blocks = batch * math.ceil((sizes["input_len"] + sizes["output_len"]) / page)
    return (blocks + 2) * page * info.kv_bytes_per_token


def predicted_failing_batch(budget_bytes: float, info, sizes: dict = SIZES) -> int:
    """The smallest batch whose KV cache exceeds the budget (modelled: the cache alone)."""
    batch = 1
    while cache_bytes(batch, info, sizes) <= budget_bytes:
        batch += 1
    return batch


def find_wall(fits, predicted: int, stopped=lambda: False) -> tuple[int, int | None]:
    """(the largest batch that fits (0: none), the smallest that fails (None: none up to
    GIVE_UP x predicted, or 16)), with fits(batch) -> bool tried first at the prediction, then in
    doubling steps away from it, then bisected."""
    if fits(predicted):
        lo, step = predicted, 1
        while not stopped():
            if lo + step > max(GIVE_UP * predicted, 16):
                return lo, None
            if not fits(lo + step):
                break
            lo, step = lo + step, step * 2
        hi = lo + step
    else:
        hi, step = predicted, 1
        while hi - step >= 1 and not stopped() and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(0, hi - step)  # fits, or 0 (nothing fits)
    while hi - lo > 1 and not stopped():
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, hi


def knobs_for(batch: int, s: dict = SIZES) -> dict:
    per = math.ceil((s["input_len"] + s["output_len"]) / s["page_size"])
    return {
        "num_blocks": batch * per,
        "page_size": s["page_size"],
        "max_batch_tokens": s["max_batch_tokens"],
    }


def workload(batch: int, s: dict = SIZES) -> Workload:
    return Workload(num_prompts=batch, input_len=s["input_len"], output_len=s["output_len"], seed=0)


@register
class MemoryWall(Scenario):
    name, order = "memory-wall", 50
    title = "memory wall: the KV cache of batch x context outgrows the memory"
    needs = ("num_blocks",)
    model_ok, takes_budget = False, True
    min_budget_gb = MIN_BUDGET_GB
    fix = "a batch the memory holds (or more memory, a smaller KV dtype)"
    why = (
        "Every request in flight keeps a KV cache that grows with its context, so the memory a "
        "server needs grows with batch x context, and past the memory it has the allocation "
        "fails. "
        "The cost model predicts where: bytes per token (2 x layers x KV heads x head dim x "
        "bytes) x context x batch for the cache, and the real run shows the gap between that "
        "prediction and the allocator (what a pass needs besides the cache). "
        "The fix is a batch the memory holds (a server sizes its cache and its batch from the "
        "memory left after the weights), or more memory per token saved (a smaller KV dtype, "
        "fewer KV heads)."
    )

    def presets(self) -> dict[str, dict]:
        return {"small": SMALL, "default": SIZES, "modelled": SIZES}

    def execute(self, ctx):
        lm, s = ctx.lm, self.sizes(ctx)
        if str(lm.device) != "cpu":
            raise ValueError("the memory-wall scenario runs on the CPU: load the model there")
        budget = (ctx.memory_budget_gb or s["budget_gb"]) * 1e9
        predicted = predicted_failing_batch(budget, lm.info, s)
        ctx.notes.update(budget_bytes=budget, predicted_batch=predicted)
        probes: dict[int, ServingResult] = {}
        server = ProbeServer.start(lm, s)  # a fresh process forks the probes (None: this one)
        if server is None:
            warm_up(lm, s)

        def probe(batch: int) -> bool:
            ctx.say(f"batch {batch} under a {budget / 1e6:.0f} MB budget (forked child)")
            probes[batch] = (
                server.probe(batch, budget) if server else serve_capped(lm, batch, budget, s)
            )
            return all(r.ok for r in probes[batch].records)

        try:
            lo, hi = find_wall(probe, predicted, ctx.stopped)
        except KeyboardInterrupt:
            ctx.notes["so_far"] = probes_so_far(probes)  # the probes done, kept, marked partial
            raise
        finally:
            if server:
                server.close()
        ctx.notes.update(probes=sorted(probes), fitted_batch=lo or None)
        failed, fitted = probes.get(hi), probes.get(lo)
        if ctx.stopped():
            for res in (failed, fitted):
                if res is not None:
                    res.meta["partial"] = True
            return failed, fitted if failed is not None else None
        return failed, fitted

    def evidence(self, broken, fixed, notes) -> dict:
        failed = broken.workload.get("num_prompts") if broken is not None else None
        return {
            "budget_bytes": notes.get("budget_bytes"),
            "predicted_batch": notes.get("predicted_batch"),
            "failed_batch": failed,
            "fitted_batch": notes.get("fitted_batch"),
            "batches_tried": notes.get("probes"),
            "error": (broken.result.get("errors") or [None])[0] if broken is not None else None,
            "out_of_memory": bool(broken is not None and broken.meta.get("out_of_memory")),
            "process_alive": True,  # this process computed the evidence: the failure was caught
            "broken": headline(broken) if broken is not None else None,
            "fixed": headline(fixed) if fixed is not None else None,
        }

    def verdict(self, ev: dict) -> str:
        mb = ev["budget_bytes"] / 1e6
        if ev["failed_batch"] is None:
            return (
                f"no batch up to {max(ev['batches_tried'])} failed under {mb:.0f} MB (predicted "
                f"failure at {ev['predicted_batch']}): either the model overestimates what this "
                "needs, or the child got back memory this long-lived process had freed (run "
                "`explorer scenario memory-wall` in a fresh process)"
            )
        how = "out of memory" if ev["out_of_memory"] else f"not out of memory: {ev['error']}"
        return (
            f"under a {mb:.0f} MB budget the cost model predicted the batch of "
            f"{ev['predicted_batch']} to fail; the run failed at {ev['failed_batch']} "
            f"({how}; caught, this process alive) and fitted {ev['fitted_batch'] or 'none'}"
        )


def probes_so_far(probes: dict) -> tuple:
    """(the smallest batch that failed, the largest that fitted) among the probes run, each
    marked partial: what Ctrl-C during the search keeps."""
    failed = [b for b, r in probes.items() if not all(x.ok for x in r.records)]
    fitted = [b for b, r in probes.items() if all(x.ok for x in r.records)]
    out = (probes[min(failed)] if failed else None, probes[max(fitted)] if fitted else None)
    for res in out:
        if res is not None:
            res.meta["partial"] = True
    return out


def warm_up(lm, s: dict) -> None:
    """One request served first: what the engine sets up once per process (lazy imports and
    caches) is then not spent in a child's budget; and the engine's cached manager, which holds
    that run's KV cache, freed (a child that frees it gets its size back on top of the budget)."""
    serve(lm, workload(1, s), "continuous", label="warm-up", **knobs_for(1, s))
    lm.model.destroy_cached_continuous_batching_manager()
    gc.collect()


class ProbeServer:
    """A freshly spawned process holding the model, from which each probe is forked: the probes
    then see the same clean heap whatever this process did before (a notebook kernel that ran
    other scenarios handed freed memory back to its children, on top of their budget)."""

    def __init__(self, process, conn):
        self.process, self.conn = process, conn

    @classmethod
    def start(cls, lm, s: dict) -> ProbeServer | None:
        """The server for a model loadable by its name (bundled, arch:, hub, local; plain
        weights), else None (the probes fork from this process)."""
        from explorer.model.loader import available_models

        name = lm.info.name
        if lm.info.weights not in ("fp32", "bf16", "fp16") or not (
            name in available_models() or lm.info.source in ("hub", "local")
        ):
            return None
        ctx = multiprocessing.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        process = ctx.Process(
            target=_probe_server, args=(child_conn, name, lm.info.dtype, s), daemon=False
        )  # not a daemon: it forks the probes (it ends when this process closes the pipe)
        process.start()
        child_conn.close()
        return cls(process, conn)

    def probe(self, batch: int, budget: float) -> ServingResult:
        self.conn.send((batch, budget))
        if not self.conn.poll(CHILD_TIMEOUT_S + SERVER_START_S):
            raise RuntimeError(f"the memory-wall probe server gave no answer for batch {batch}")
        kind, got = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"the memory-wall probe server failed: {got}")
        return ServingResult.from_dict(got)

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _probe_server(conn, name: str, dtype: str, s: dict) -> None:
    """In the spawned server: load the model, warm up, then fork one capped child per probe."""
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends this process
    torch.set_num_threads(1)
    try:
        from explorer.model.loader import load

        lm = load(name, device="cpu", dtype=dtype)
        warm_up(lm, s)
        while (msg := conn.recv()) is not None:
            batch, budget = msg
            conn.send(("ok", serve_capped(lm, batch, budget, s).to_dict()))
    except (EOFError, KeyboardInterrupt):
        return
    except Exception as err:  # noqa: BLE001 - said to the parent in one line
        conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0][:300]))


def serve_capped(lm, batch: int, budget: float, s: dict = SIZES) -> ServingResult:
    """Serve `batch` requests (cache sized for them) in a forked child capped at `budget` bytes
    of data above its size at the fork; its ServingResult, or one whose requests carry why it
    failed (meta["out_of_memory"] True when it ran out)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    requests = workload(batch, s).requests(lm)  # tokenized here: the child only serves
    child = ctx.Process(target=_child, args=(send, lm, requests, budget, s), daemon=True)
    child.start()
    send.close()
    got, answered = None, False
    try:
        got = receive.recv() if receive.poll(CHILD_TIMEOUT_S) else None
        answered = True
    except EOFError:  # it ended without sending
        answered = True
    finally:  # Ctrl-C here too: the child (which ignores SIGINT) never outlives its probe
        child.join(5 if answered else 0)
        if child.is_alive():
            child.kill()
            child.join()
    if got is None:
        why = f"the child process ended without a result (exit code {child.exitcode})"
        return failed_result(lm, batch, why, child.exitcode in (-9, 137), s)
    if "error" in got:
        return failed_result(lm, batch, got["error"], got["out_of_memory"], s)
    return ServingResult.from_dict(got["result"])


def failed_result(
    lm, batch: int, error: str, out_of_memory: bool, s: dict = SIZES
) -> ServingResult:
    """A batch that never ran: each request carries the error."""
    reqs = workload(batch, s).requests(lm)
    records = [
        RequestRecord(r.id, len(r.prompt_ids), r.max_tokens, r.arrival_s, error=error) for r in reqs
    ]
    meta = run_meta(lm, "failed (out of memory)" if out_of_memory else "failed", f"batch {batch}")
    meta.update(partial=False, out_of_memory=out_of_memory)
    engine = {"engine": "continuous", **knobs_for(batch, s)}
    return ServingResult(
        engine, workload(batch, s).to_dict(), records, [], summarise(records), meta
    )


def _child(send, lm, requests, budget: float, s: dict) -> None:
    """In the forked child: cap the data segment, serve the batch, send what happened. Nothing
    in the child touches the tokenizer (a Rust allocation that fails aborts the process)."""
    import logging
    import resource
    import signal
    import threading

    import torch

    from explorer.model.device import is_out_of_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends this child
    gc.freeze()  # the parent's objects: transformers' gc.collect() at stop skips them
    batch = len(requests)
    tokenizer, lm.tokenizer = lm.tokenizer, None  # the child's copy: outputs stay token ids
    # (kept referenced: freeing it here would hand its memory back on top of the budget)
    torch.set_num_threads(1)  # no thread pool's stacks in the budget
    fresh_mappings()
    threading.stack_size(256 * 1024)
    # the parent's threads left their stacks here; glibc unmaps those past its stack cache when
    # the next thread starts: started now, so that room is not handed back inside the budget
    spare = threading.Thread(target=int)
    spare.start()
    spare.join()
    errors: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: errors.append(record.getMessage())
    for name in ("ContinuousBatchingLogger", "transformers"):
        log = logging.getLogger(name)  # the child's copy: its errors come back in our records
        log.handlers, log.propagate = [handler], False
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (data_bytes() + int(budget), hard))
    try:
        t0 = time.perf_counter()
        res = serve(lm, requests, "continuous", label=f"batch {batch}", **knobs_for(batch, s))
        res.meta["seconds"] = time.perf_counter() - t0
        oom = next((e for e in errors if is_out_of_memory(RuntimeError(e))), None)
        out = {"result": res.to_dict()} if oom is None else {"error": oom, "out_of_memory": True}
    except (MemoryError, RuntimeError) as err:
        text = next((e for e in errors if is_out_of_memory(RuntimeError(e))), str(err))
        oom = isinstance(err, MemoryError) or is_out_of_memory(RuntimeError(text))
        out = {"error": text.splitlines()[0][:300] or "MemoryError", "out_of_memory": oom}
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    send.send(out)
    send.close()
    del tokenizer


def fresh_mappings(threshold: int = 64 * 1024) -> None:
    """glibc: every allocation above `threshold` bytes gets its own new mapping (counted against
    RLIMIT_DATA), instead of reusing free space the heap already had at the fork (which would let
    a batch past the budget through), and the heap's free top is trimmed now and whenever it
    passes `threshold`. Nothing happens where glibc's mallopt is not there."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD (fixed: no dynamic threshold)
        # the heap's free top, kept by the parent's raised trim threshold, goes back now (or a
        # later free in the child would hand it back as room on top of the budget)
        libc.mallopt(-1, threshold)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def data_bytes() -> int:
    """This process's data segment (VmData), what RLIMIT_DATA limits."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmData in /proc/self/status (RLIMIT_DATA needs Linux)")
