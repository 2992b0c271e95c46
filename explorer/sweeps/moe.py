"""Mixture of experts: which weights a decode step really reads, as the batch grows.

At batch 1 a decode step of an MoE model reads the shared weights (attention, norms, router,
embeddings, shared experts) and, per layer, only the k experts its token is routed to. A batch of
B tokens touches the union of their choices: more experts per layer as B grows, until every one
of the E experts is read each step, while the FLOPs per token stay those of the k active experts.

Per batch size the sweep prefills B rows of distinct seeded tokens, reads the router's choices
of one untimed decode pass (hooks on the router modules, removed after it; explorer.inside), then
times `repeats` decode passes of the same tokens without hooks. Columns:

    experts_touched            distinct experts the batch's tokens were routed to, per layer (mean
                               over layers; experts_touched_per_layer lists every layer), measured
    experts_touched_formula    E x (1 - (1 - k/E)^B): the expectation if every token picked its k
                               experts uniformly at random (modelled)
    bytes_per_step             modelled bytes of the step with the touched experts' weights only
    ms_per_step                measured, median of repeats
    regime                     explorer.costs.split's rule on the measured step

and, modelled beside them, a dense model of the same total size (every expert read every step) and
one of the same active size (k experts per layer, whatever the batch): their bytes and their
roofline time on this machine's peaks.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterable

import pandas as pd
import torch

from explorer import costs
from explorer.costs.split import utilisation
from explorer.inside.hooks import hooked
from explorer.model.loader import LoadedModel
from explorer.model.passes import crop_cache, forward
from explorer.sweeps import CONTEXT, REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    Bar,
    Progress,
    attrs,
    check_context,
    check_count,
    frame,
    measure_points,
    peaks_for,
    prefill_cache,
    sizes,
    time_decode,
    token_ids,
)

COLUMNS = [
    "batch",
    "context_len",
    "experts",
    "experts_per_token",
    "experts_touched",
    "experts_touched_per_layer",
    "experts_touched_formula",
    "bytes_per_step",
    "flops_per_token_modelled",
    "ms_per_step",
    "bound_ms_modelled",
    "regime",
    "bytes_per_step_dense_total_modelled",
    "bytes_per_step_dense_active_modelled",
    "ms_per_step_dense_total_modelled",
    "ms_per_step_dense_active_modelled",
]


# --- the router, read during a pass -------------------------------------------------------------


def routers(model) -> list[torch.nn.Module]:
    """The router of every MoE layer, in layer order (transformers' *TopKRouter modules: their
    forward returns (logits, top-k weights, top-k expert indices))."""
    return [m for _, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]


def experts_of(model) -> tuple[int, int]:
    """(E experts per MoE layer, k experts per token) from the model's config; (0, 0): dense."""
    c = model.config
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0
    return int(experts), int(getattr(c, "num_experts_per_tok", 0) or 0)


def require_moe(lm: LoadedModel) -> tuple[int, int]:
    """(E, k) of an MoE model; a dense one is refused in one line."""
    experts, k = experts_of(lm.model)
    if not experts or not routers(lm.model):
        raise ValueError(
            f"{lm.info.name} is a dense model (no router, every weight read every step): the moe "
            "sweep needs a mixture-of-experts model, e.g. bundled:moe"
        )
    return experts, k


def routed(model, run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Call run() with a hook on every router; per layer, the top-k experts each token of the
    pass was routed to and their weights, ([tokens, k] indices, [tokens, k] weights) as CPU
    copies. The hooks are gone after it."""
    chosen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(module, args, output):
        chosen.append(tuple(t.detach().to("cpu", copy=True) for t in (output[2], output[1])))

    with hooked({r: (None, keep) for r in routers(model)}):
        run()
    return chosen


def touched_per_layer(chosen: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """Distinct experts the pass's tokens were routed to, per layer."""
    return [int(idx.unique().numel()) for idx, _ in chosen]


# --- the cost model's view of one decode step ---------------------------------------------------


def expected_touched(experts: int, k: int, tokens: int) -> float:
    """E x (1 - (1 - k/E)^tokens): distinct experts per layer if each token picked its k
    uniformly at random (modelled)."""
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


def expert_bytes(model, experts: int) -> float:
    """Bytes of one routed expert of one layer (counted from the first MoE layer's weights)."""
    router = routers(model)[0]
    for module in model.modules():
        if getattr(module, "gate", None) is router and hasattr(module, "experts"):
            held = sum(p.numel() * p.element_size() for p in module.experts.parameters())
            return held / experts
    raise ValueError("no experts module beside the router")


def step_cost(
    lm: LoadedModel, batch: int, context_len: int, touched: list[float], per_token: int
) -> dict:
    """Modelled FLOPs and bytes of one decode step of `batch` rows at `context_len` whose MoE
    layers read `touched` experts each and run `per_token` experts for every token: every weight
    but the untouched experts, the input embedding's gathered rows only, K/V read for the past
    and written for the fed token."""
    info, model = lm.info, lm.model
    experts = experts_of(model)[0]
    each = expert_bytes(model, experts)
    value = torch.finfo(model.dtype).bits // 8
    table = info.vocab_size * info.hidden_size * value
    weights = info.weight_bytes - (0 if info.tied_embeddings else table)
    weights += batch * info.hidden_size * value
    unread = sum((experts - t) * each for t in touched)
    kv = info.kv_bytes_per_token * batch * context_len
    active = info.non_embedding_parameters - len(touched) * (experts - per_token) * each / value
    scores = 4 * batch * info.attention_heads * info.head_dim * context_len * info.layers
    flops = 2.0 * batch * (active + info.vocab_size * info.hidden_size) + scores
    return {"bytes": weights - unread + kv, "flops": flops}


def bound_ms(cost: dict, peaks) -> float:
    return costs.roofline(cost["flops"], cost["bytes"], peaks)[0] * 1e3


# --- the sweep ----------------------------------------------------------------------------------


def run(
    lm: LoadedModel,
    *,
    batches: Iterable[int] = (1, 4, 16, 64),
    context_len: int = 32,
    repeats: int = 3,
    peaks=None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Experts touched per layer (measured vs the uniform formula), bytes and ms per decode step
    vs batch size, beside dense models of the same total and the same active size (modelled).
    A dense model is refused in one line."""
    experts, k = require_moe(lm)
    batches = sizes("batches", batches)
    check_count("context_len", context_len, 2)
    check_count("repeats", repeats)
    check_context(lm.info, context_len)
    peaks = peaks_for(lm, peaks)
    notes: list[str] = []
    progress_bar = Bar(len(batches) * repeats, "moe sweep", progress, bar)

    def point(B: int) -> dict:
        return _row(lm, peaks, B, context_len, repeats, seed, progress_bar.update)

    try:
        rows = measure_points(batches, point, notes, label=lambda B: f"B={B}", stop=stop)
    finally:
        progress_bar.close()
    extra = {"context_len": context_len, "experts": experts, "experts_per_token": k}
    return frame(
        rows,
        COLUMNS,
        attrs("moe", lm, peaks, notes, COLUMNS, repeats=repeats, warmup=1, **extra),
    )


def _row(lm: LoadedModel, peaks, B: int, context_len: int, repeats: int, seed: int, tick) -> dict:
    experts, k = experts_of(lm.model)
    prompt = token_ids(lm.info, B, context_len - 1, lm.device, seed)  # [B, L - 1]: distinct rows
    cache = prefill_cache(lm.model, prompt)
    feed = token_ids(lm.info, B, 1, lm.device, seed + 1)  # [B, 1]
    past = cache.get_seq_length()
    chosen = routed(lm.model, lambda: forward(lm.model, feed, cache, last_only=True))
    crop_cache(cache, past)
    samples = time_decode(
        lm.model, cache, feed, repeats=repeats, warmup=1, device=lm.device, tick=tick
    )
    seconds = statistics.median(samples)
    touched = touched_per_layer(chosen)
    layers = len(touched)
    cost = step_cost(lm, B, context_len, touched, k)
    total = step_cost(lm, B, context_len, [experts] * layers, experts)
    active = step_cost(lm, B, context_len, [k] * layers, k)
    split = utilisation(cost["flops"], cost["bytes"], seconds, peaks)
    return {
        "batch": B,
        "context_len": context_len,
        "experts": experts,
        "experts_per_token": k,
        "experts_touched": statistics.mean(touched),
        "experts_touched_per_layer": touched,
        "experts_touched_formula": expected_touched(experts, k, B),
        "bytes_per_step": cost["bytes"],
        "flops_per_token_modelled": cost["flops"] / B,
        "ms_per_step": seconds * 1e3,
        "bound_ms_modelled": bound_ms(cost, peaks),
        "regime": split["regime"],
        "bytes_per_step_dense_total_modelled": total["bytes"],
        "bytes_per_step_dense_active_modelled": active["bytes"],
        "ms_per_step_dense_total_modelled": bound_ms(total, peaks),
        "ms_per_step_dense_active_modelled": bound_ms(active, peaks),
    }


SWEEP = register(
    Sweep(
        name="moe",
        title="Mixture of experts",
        run=run,
        columns=COLUMNS,
        order=45,
        help="experts touched, bytes and ms per decode step vs batch (MoE models)",
        params=(
            Param("batches", "ints", "batch sizes", "1, 4, 16, 64", "batch sizes, e.g. 1,4,16,64"),
            CONTEXT,
            REPEATS,
        ),
    )
)
