"""Where the time of one step goes, by part of the model: a replay of the step under torch.profiler.

Scoped hooks (explorer.inside.hooks) open a profiler range around each part of the model as it
runs: `ie:embedding`, per layer `ie:layer{i}` (the block), `ie:layer{i}/attention`, its q/k/v/o
projections `ie:layer{i}/attention/proj`, the KV-cache update `ie:layer{i}/kv_update` (the cache's
update() wrapped for the pass), `ie:layer{i}/mlp`, `ie:layer{i}/norm`, then `ie:final_norm`,
`ie:lm_head`, and the sampling chain `ie:sampling`, all inside `ie:step`.

Attribution: every profiler op (aten::...) counts its *self* time to the nearest enclosing ie:
range, so nothing is counted twice; per-layer ranges are summed over layers. The self time of the
ie: ranges themselves (time inside a module that no op accounts for: Python, the module call
machinery, hooks) is `framework/python`. On CUDA the parts count their kernels' device time and
framework/python is the rest of the wall time (the GPU idle between kernels: launches, Python).
`unattributed` = wall time - everything above (profiler start/stop, the timer itself).

Parts:
    embedding             token (and position) embedding lookup
    attention/proj        q, k, v, o projections (matmuls)
    attention/core        RoPE, scores, softmax, weighted sum (SDPA), reshapes
    attention/kv_update   writing the new K/V into the cache (DynamicCache: torch.cat)
    mlp                   the MLP
    norms                 every norm (layer norms and the final norm)
    residual/other        ops in a layer block outside the parts above (residual adds)
    model/other           ops outside every layer (masks, rotary tables, output wrapping)
    lm_head               the output projection
    sampling              the sampling chain and the draw
Each part is shown beside the cost model's bytes and FLOPs of the same part (MODELLED_PARTS) and its
floor at the measured peaks. Profiling adds its own overhead: the profiled wall time is reported
beside the step's unprofiled latency, and the shares are of the profiled time.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch.autograd.profiler import record_function

from explorer.costs import noise
from explorer.costs.timing import Measurement, synchronize, usage_for
from explorer.inside.hooks import InsideUnavailable, hooked
from explorer.model.layout import LayoutError, layout

PARTS = (
    "embedding",
    "attention/proj",
    "attention/core",
    "attention/kv_update",
    "mlp",
    "norms",
    "residual/other",
    "model/other",
    "lm_head",
    "sampling",
    "framework/python",
    "unattributed",
)
# part -> (cost-model byte parts, cost-model FLOP parts)
MODELLED_PARTS = {
    "embedding": (("weights/embedding", "weights/position_embedding"), ()),
    "attention/proj": (("weights/attention",), ("flops/attention_proj",)),
    "attention/core": (("kv_read",), ("flops/attention_scores",)),
    "attention/kv_update": (("kv_write",), ()),
    "mlp": (("weights/mlp",), ("flops/mlp",)),
    "norms": (("weights/norms",), ()),
    "lm_head": (("weights/lm_head",), ("flops/lm_head",)),
}


def _part_of(range_name: str) -> str:
    """ie:layer3/attention/proj -> attention/proj; ie:layer3 -> residual/other; ie:step -> model/other."""
    name = range_name[3:]
    if name == "step":
        return "model/other"
    if name.startswith("layer"):
        rest = name.split("/", 1)[1] if "/" in name else ""
        return {
            "": "residual/other",
            "attention": "attention/core",
            "attention/proj": "attention/proj",
            "kv_update": "attention/kv_update",
            "mlp": "mlp",
            "norm": "norms",
        }[rest]
    return {"final_norm": "norms"}.get(name, name)


def range_pair(name: str, open_ranges: dict) -> tuple:
    """(pre, post) forward hooks that open and close the profiler range `name` around a module's
    forward (open ranges kept per module in `open_ranges`, a defaultdict(list))."""

    def pre(module, args):
        rf = record_function(name)
        rf.__enter__()
        open_ranges[id(module)].append(rf)

    def post(module, args, output):
        open_ranges[id(module)].pop().__exit__(None, None, None)

    return pre, post


def _range_hooks(lay) -> dict:
    """{module: (pre, post)} that open and close a named profiler range around each part."""
    open_ranges: dict[int, list] = defaultdict(list)

    def pair(name: str):
        return range_pair(name, open_ranges)

    hooks = {m: pair("ie:embedding") for m in lay.embeddings}
    for layer in lay.layers:
        hooks[layer.block] = pair(f"ie:layer{layer.index}")
        hooks[layer.attention] = pair(f"ie:layer{layer.index}/attention")
        hooks[layer.mlp] = pair(f"ie:layer{layer.index}/mlp")
        for m in layer.projections:
            hooks[m] = pair(f"ie:layer{layer.index}/attention/proj")
        for m in layer.norms:
            hooks[m] = pair(f"ie:layer{layer.index}/norm")
    hooks[lay.final_norm] = pair("ie:final_norm")
    hooks[lay.lm_head] = pair("ie:lm_head")
    return hooks


@contextmanager
def _kv_update_range(cache):
    """Wrap cache.update (instance attribute, removed on exit) in an ie:layer{i}/kv_update range."""
    if cache is None:
        yield
        return
    original = cache.update

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        with record_function(f"ie:layer{layer_idx}/kv_update"):
            return original(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = update
    try:
        yield
    finally:
        del cache.update


def _ie_ancestor(event):
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith("ie:"):
        parent = parent.cpu_parent
    return parent


def _root(event):
    while event.cpu_parent is not None:
        event = event.cpu_parent
    return event


def attribute(events, cuda: bool = False) -> list[dict[str, float]]:
    """Seconds by part for each ie:step root in a profiler's event list (one dict per repeat)."""
    per_root: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.name.startswith("ie:"):
            if e.name == "ie:step" and e.cpu_parent is None:
                per_root[id(e)]["_wall_total"] += e.cpu_time_total / 1e6
            if not cuda:
                per_root[id(_root(e))]["framework/python"] += e.self_cpu_time_total / 1e6
            continue
        owner = _ie_ancestor(e)
        if owner is None:
            continue  # outside the replayed step (profiler bookkeeping)
        value = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6
        per_root[id(_root(e))][_part_of(owner.name)] += value
    return [dict(v) for v in per_root.values() if "_wall_total" in v]


def _modelled(part: str, cost, peaks) -> dict:
    if part not in MODELLED_PARTS:
        return {"bytes": None, "flops": None, "floor_s": None}
    byte_keys, flop_keys = MODELLED_PARTS[part]
    nbytes = sum(cost.bytes.get(k, 0.0) for k in byte_keys)
    flops = sum(cost.flops.get(k, 0.0) for k in flop_keys)
    floor = None
    if peaks is not None:
        bandwidth = peaks.bandwidth_for(cost.bound_bytes) * 1e9
        floor = max(nbytes / bandwidth, flops / peaks.roofline_flops)
    return {"bytes": nbytes, "flops": flops, "floor_s": floor}


def _run_once(model, replay, kw, sample, hooks, device, wall: list[float]) -> None:
    synchronize(device)
    t0 = time.perf_counter()
    with record_function("ie:step"):
        cache = replay.fresh_cache()
        with hooked(hooks), _kv_update_range(cache):
            out = replay.run_on(model, cache, **kw)
        with record_function("ie:sampling"):
            sample(out.logits[:, -1].float())
    synchronize(device)
    wall.append(time.perf_counter() - t0)


def profile_replay(
    model,
    replay,
    *,
    sample,
    cost,
    peaks,
    latency_s: float | None = None,
    forward_kwargs: dict | None = None,
    repeats: int = 3,
) -> dict:
    """Profile one replayed step `repeats` times (after one unrecorded warm-up); medians by part.

    replay: an explorer.engine.replay.Replay (fresh_cache(), run_on(), index, feed); sample: the
    step's sampling chain as a function of the last logits [B, V] (on a copy of the generator);
    cost: the step's explorer.costs.parts.ForwardCost; peaks: the measured Peaks (or None);
    latency_s: the step's own unprofiled latency (None for the pending step)."""
    if not isinstance(repeats, int) or not 1 <= repeats <= 50:
        raise ValueError(f"repeats must be an integer in 1..50, got {repeats!r}")
    try:
        hooks = _range_hooks(layout(model))
    except LayoutError as e:
        raise InsideUnavailable(f"profile unavailable: {e}") from None
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    wall: list[float] = []
    usage = usage_for(device, None)  # how busy the machine was during the timed repeats
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(repeats + 1):
            with noise.Region(usage if i else noise.Usage()):
                _run_once(model, replay, forward_kwargs or {}, sample, hooks, device, wall)
    per_repeat = attribute(prof.events(), cuda=cuda)[1:]  # drop the warm-up
    summary = _summary(per_repeat, wall[1:], cuda, cost, peaks)
    timed = Measurement(wall[1:], warmup=1, usage=usage)
    summary |= {"spread": timed.spread, "noisy": timed.noisy, "noisy_reason": timed.reason}
    return {
        "step": replay.index,
        "phase": "prefill" if replay.past == 0 else "decode",
        "device": str(device),
        "dtype": str(model.dtype).replace("torch.", ""),
        "latency_s": latency_s,
        **summary,
    }


def _summary(per_repeat, wall, cuda, cost, peaks) -> dict:
    wall_s = statistics.median(wall)
    times = {p: statistics.median(r.get(p, 0.0) for r in per_repeat) for p in PARTS[:-2]}
    if cuda:
        times["framework/python"] = max(0.0, wall_s - sum(times.values()))
    else:
        times["framework/python"] = statistics.median(
            r.get("framework/python", 0.0) for r in per_repeat
        )
    attributed = sum(times.values())
    times["unattributed"] = max(0.0, wall_s - attributed)
    total = max(wall_s, attributed)
    rows = []
    for part in PARTS:
        m = _modelled(part, cost, peaks)
        t = times[part]
        sol = 100.0 * m["floor_s"] / t if m["floor_s"] and t > 0 else None
        rows.append({"part": part, "time_s": t, "share": t / total, **m, "speed_of_light_pct": sol})
    ranked = sorted((r for r in rows if r["part"] != "unattributed"), key=lambda r: -r["time_s"])
    return {
        "timing": "device (CUDA kernel) time per op" if cuda else "CPU self time per op",
        "repeats": len(wall),
        "wall_s": wall_s,
        "coverage": min(1.0, attributed / wall_s) if wall_s > 0 else None,
        "python_share": times["framework/python"] / total,
        "parts": rows,
        "top": [r["part"] for r in ranked[:3]],
        "note": (
            "measured: median of the repeats of one replayed step under torch.profiler (profiling "
            "adds overhead; latency_s is the step's own unprofiled time). Modelled bytes/FLOPs and "
            "floors from explorer.costs.parts at the measured peaks."
        ),
    }
