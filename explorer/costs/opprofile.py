"""Measured per operator on this machine: a replay of one step under torch.profiler with a range
around each module that is one operator (q_proj, gate_proj, a norm, lm_head, ...), so each op of
explorer.costs.operators gets its measured time beside its modelled one.

Attribution (as explorer.costs.profile, one level finer): every profiler op counts its *self* time
to the nearest enclosing range, summed over layers; medians over the repeats. Ops that are not
modules are told apart by their aten name inside their module: in the attention module, fused
attention (scaled_dot_product / flash) -> `attention`, softmax -> `softmax`, matmul / bmm ->
`qk_scores` (eager: QK^T and attn x V are the same aten op, measured together), the rest (RoPE,
reshapes, the cache's views) -> `rope` (`attention` for GPT-2); in the MLP module its own ops
(SiLU x up, the top-k and combine of an MoE) -> `act_mul` / `gelu` / `topk`. What cannot be split
(the two residual adds, a MoE's experts module, eager QK^T with attn x V, the sampling chain's
stages, which share aten ops: sort, cumsum, softmax) is measured as a group on its first op; the others' rows say which op
holds their time and which part it sits in. Two rows have no operator: `model/other` (masks,
rotary tables, outside every layer) and `framework/python` (time inside modules that no op
accounts for: the overhead). Profiling adds overhead of its own; shares are of the profiled time.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch

from explorer.costs.profile import _ie_ancestor, _root, _run_once, range_pair
from explorer.inside.hooks import InsideUnavailable
from explorer.model.layout import LayoutError, layout

ATTN_CHILDREN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "o_proj",
                 "c_attn": "qkv_proj", "c_proj": "o_proj", "q_norm": "q_norm", "k_norm": "k_norm"}  # fmt: skip
MLP_CHILDREN = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj",
                "act_fn": "act_mul", "c_fc": "fc", "c_proj": "proj", "act": "gelu",
                "gate": "router", "router": "router", "experts": "experts_gate_up",
                "shared_expert": "shared_expert", "shared_experts": "shared_expert"}  # fmt: skip
# op -> the op whose measured time includes it (cannot be told apart)
GROUPS = {"mlp_residual": "attn_residual", "attn_v": "qk_scores", "experts_act": "experts_gate_up",
          "experts_down": "experts_gate_up", "combine": "topk", "shared_expert_gate": "router",
          "sampling/softmax": "sampling/processors", "sampling/draw": "sampling/processors"}  # fmt: skip
OVERHEAD_RATIO = 0.5  # a measured op whose modelled floor explains < half its time: overhead-bound


def op_hooks(model) -> dict:
    """{module: (pre, post)} opening a range `ie:<op>` (or a part's range) around each module."""
    lay = layout(model)
    open_ranges: dict[int, list] = defaultdict(list)
    hooks = {}
    for m, name in zip(lay.embeddings, ("embed_tokens", "embed_positions")):
        hooks[m] = range_pair(f"ie:op/{name}", open_ranges)
    for layer in lay.layers:
        hooks[layer.block] = range_pair("ie:layer", open_ranges)
        hooks[layer.attention] = range_pair("ie:attention", open_ranges)
        hooks[layer.mlp] = range_pair("ie:mlp", open_ranges)
        for m, name in zip(layer.norms, ("attn_norm", "mlp_norm")):
            hooks[m] = range_pair(f"ie:op/{name}", open_ranges)
        for parent, table in ((layer.attention, ATTN_CHILDREN), (layer.mlp, MLP_CHILDREN)):
            for attr, m in parent.named_children():
                if attr in table:
                    hooks[m] = range_pair(f"ie:op/{table[attr]}", open_ranges)
    hooks[lay.final_norm] = range_pair("ie:op/final_norm", open_ranges)
    hooks[lay.lm_head] = range_pair("ie:op/lm_head", open_ranges)
    return hooks


def _aten_op(owner: str, aten: str, kind: str) -> str:
    """The operator an aten op inside `owner`'s range belongs to (kind: the MLP's, swiglu | gelu |
    moe; gelu is GPT-2, whose attention has no RoPE)."""
    a = aten.lower()
    if owner.startswith("ie:op/"):
        return owner[6:]
    if owner == "ie:attention":
        if "scaled_dot_product" in a or "flash" in a or "efficient_attention" in a:
            return "attention"
        if "softmax" in a:
            return "softmax"
        if a in ("aten::matmul", "aten::bmm", "aten::baddbmm"):
            return "qk_scores"
        return "attention" if kind == "gelu" else "rope"
    if owner == "ie:mlp":
        return {"gelu": "gelu", "swiglu": "act_mul"}.get(kind, "topk")
    if owner == "ie:sampling":  # the chain's stages share aten ops (sort, cumsum, softmax)
        return "sampling/processors"
    if owner.endswith("/kv_update"):
        return "kv_write"
    return {"ie:layer": "attn_residual", "ie:step": "model/other"}.get(owner, "model/other")


def attribute_ops(events, mlp_kind: str) -> list[dict[str, float]]:
    """Seconds by operator for each ie:step root (one dict per repeat), CPU self time."""
    per_root: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.name.startswith("ie:"):
            if e.name == "ie:step" and e.cpu_parent is None:
                per_root[id(e)]["_wall"] += e.cpu_time_total / 1e6
            per_root[id(_root(e))]["framework/python"] += e.self_cpu_time_total / 1e6
            continue
        owner = _ie_ancestor(e)
        if owner is not None:
            op = _aten_op(owner.name, e.name, mlp_kind)
            per_root[id(_root(e))][op] += e.self_cpu_time_total / 1e6
    return [dict(v) for v in per_root.values() if "_wall" in v]


def profile_ops_replay(model, replay, *, sample, forward_kwargs=None, repeats: int = 3) -> dict:
    """Median seconds per operator of one replayed step (after one unrecorded warm-up), CPU self
    time; {"ops": {op: s}, "wall_s", "repeats", "timing"}. On CUDA, CPU-side time only."""
    if not isinstance(repeats, int) or not 1 <= repeats <= 50:
        raise ValueError(f"repeats must be an integer in 1..50, got {repeats!r}")
    try:
        hooks = op_hooks(model)
    except LayoutError as e:
        raise InsideUnavailable(f"profile unavailable: {e}") from None
    family = getattr(model.config, "model_type", "")
    kind = "gelu" if family == "gpt2" else "moe" if _is_moe(model.config) else "swiglu"
    device = next(model.parameters()).device
    wall: list[float] = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(repeats + 1):
            _run_once(model, replay, forward_kwargs or {}, sample, hooks, device, wall)
    runs = attribute_ops(prof.events(), kind)[1:]  # drop the warm-up
    names = sorted({k for r in runs for k in r if k != "_wall"})
    ops = {n: statistics.median(r.get(n, 0.0) for r in runs) for n in names}
    wall_s = statistics.median(wall[1:])
    ops["unattributed"] = max(0.0, wall_s - sum(ops.values()))
    return {
        "ops": ops,
        "wall_s": wall_s,
        "repeats": len(runs),
        "timing": f"CPU self time per op, median of {len(runs)} profiled replays on {device}",
    }


def _is_moe(config) -> bool:
    return bool(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None))


def merge_measured(rows: list[dict], measured: dict) -> list[dict]:
    """The modelled rows with `measured_s` (or `measured_note`) and `measured_bound`, plus rows
    for the time no operator accounts for (model/other, framework/python, unattributed)."""
    ops = measured["ops"]
    names = {r["name"] for r in rows}
    out = []
    for r in rows:
        r = dict(r)
        holder = GROUPS.get(r["name"])
        if r["name"] in ops:
            r["measured_s"] = ops[r["name"]]
            grouped = [n for n, h in GROUPS.items() if h == r["name"] and n in names]
            if grouped:
                r["measured_note"] = f"includes {', '.join(grouped)} (not separable)"
            if r["name"] == "rope" or (r["name"] == "attention" and "rope" not in names):
                r["measured_note"] = "includes the attention module's other ops (reshapes, views)"
            slow = r["measured_s"] > 0 and r["time_s"] < OVERHEAD_RATIO * r["measured_s"]
            r["measured_bound"] = "overhead" if slow else r["bound"]
        else:
            r["measured_s"] = None
            where = f"in {holder}'s time" if holder in ops else "not seen by the profiler"
            r["measured_note"] = f"not separated: {where} (part {r['part']})"
        out.append(r)
    for extra in ("model/other", "framework/python", "unattributed"):
        out.append(_extra_row(extra, ops.get(extra, 0.0), rows[0].get("phase", "decode")))
    return out


EXTRA_WHAT = {
    "model/other": "Ops outside every layer and operator: masks, rotary tables, output wrapping.",
    "framework/python": "Time inside modules that no op accounts for: Python, module calls, hooks.",
    "unattributed": "Wall time of the profiled step that no range holds (profiler, timer).",
}


def _extra_row(name: str, seconds: float, phase: str) -> dict:
    return {
        "name": name, "stage": "overhead", "kind": "overhead", "part": name, "block": "",
        "what": EXTRA_WHAT[name], "shapes": "-", "count": 1, "flops": 0.0, "flop_part": None,
        "bytes": {}, "intensity": None, "time_s": 0.0, "bound": "overhead", "total_flops": 0.0,
        "total_bytes": 0.0, "share": 0.0, "phase": phase, "measured_s": seconds,
        "measured_bound": "overhead",
    }  # fmt: skip


def step_table(info, step, *, fused: bool = True):
    """The operator table (explorer.costs.operators) of a recorded Step, as the session ran it
    (logits of the last position only; the experts its router touched, when recorded)."""
    from explorer.costs.operators import operators

    routing = getattr(step, "routing", None) or {}
    return operators(
        info,
        batch=step.batch_size,
        tokens_fed=step.tokens_fed,
        context_len=step.context_len,
        use_cache=step.cache_type is not None or bool(step.kv_cache_bytes),
        logits_positions=1,
        experts_touched=routing.get("experts_touched"),
        fused_attention=fused,
    )


def fused_attention(model) -> bool:
    """False when the model runs eager attention (QK^T, softmax, attn x V as separate ops)."""
    return getattr(model.config, "_attn_implementation", "sdpa") != "eager"


def step_ops(lm, replay, step, *, sample, peaks, forward_kwargs=None, repeats: int = 3) -> dict:
    """One step operator by operator: modelled at `peaks` beside measured (profile_ops_replay)."""
    from explorer.costs.operators import operators
    from explorer.costs.optime import timed

    fused = fused_attention(lm.model)
    if step is not None:
        table = step_table(lm.info, step, fused=fused)
    else:  # the pending prefill
        n = replay.feed.shape[1]
        table = operators(lm.info, batch=replay.ids.shape[0], tokens_fed=n,
                          context_len=replay.ids.shape[1], use_cache=replay.cache is not None,
                          logits_positions=1, fused_attention=fused)  # fmt: skip
    measured = profile_ops_replay(lm.model, replay, sample=sample, forward_kwargs=forward_kwargs,
                                  repeats=repeats)  # fmt: skip
    rows = merge_measured(timed(table, peaks), measured)
    return {"step": replay.index, "phase": table.phase, "rows": rows, **measured}


def profile_session_ops(session, step: int | None = None, *, repeats: int = 3) -> dict:
    """A Session's step `step` (default: the latest; the pending prefill before any) operator by
    operator, as Session.profile_step does for parts (its lock, its replay, its sampling chain on
    a copy of its generator: the session is unchanged). Kept here, not on Session, whose module
    sits past the house's size fence."""
    with session._exclusive("profile_ops()"):
        r = session._replay(step)
        rec = session.trace.steps[r.index] if r.index < len(session.trace.steps) else None
        return step_ops(session.lm, r, rec, sample=session._replay_sampler(r),
                        peaks=session._peaks(), forward_kwargs=session._last_only_kwargs(),
                        repeats=repeats)  # fmt: skip
