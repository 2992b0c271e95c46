"""Mixture of experts: which weights a decode step really reads, as the batch grows.

At batch 1 a decode step of an MoE model reads the shared weights (attention, norms, router,
embeddings, shared experts) and, per layer, only the k experts its token is routed to. A batch of
B tokens touches the union of their choices: more experts per layer as B grows, until every one
of the E experts is read each step, while the FLOPs per token stay those of the k active experts.

Per batch size the sweep prefills B distinct rows (windows of held-out text when the model has a
tokenizer: a trained router routes text, not random ids; else seeded random ids), reads the router's choices
of one untimed decode pass (explorer.engine.routing.capture: hooks removed after it), then
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
from explorer.engine.routing import capture
from explorer.model.loader import LoadedModel
from explorer.model.moe import experts_touched_expected, routers
from explorer.model.passes import crop_cache, forward
from explorer.sweeps import CONTEXT, REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    attrs,
    check_context,
    check_count,
    frame,
    measure_points,
    noise_columns,
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
    *NOISE_COLUMNS,
]


# --- the router, read during a pass -------------------------------------------------------------


def require_moe(lm: LoadedModel) -> tuple[int, int]:
    """(E, k) of an MoE model; a dense one is refused in one line."""
    if not lm.info.is_moe or not routers(lm.model):
        raise ValueError(
            f"{lm.info.name} is a dense model (no router, every weight read every step): the moe "
            "sweep needs a mixture-of-experts model, e.g. bundled:moe"
        )
    return lm.info.num_experts, lm.info.experts_per_token


# --- the cost model's view of one decode step ---------------------------------------------------


def step_cost(lm: LoadedModel, batch: int, context_len: int, touched: list[float]) -> dict:
    """Modelled FLOPs and bytes of one decode step of `batch` rows at `context_len` whose MoE
    layers read `touched` experts each (explorer.costs: the experts touched, k computed per token)."""
    cost = costs.forward_cost(
        lm.info,
        batch=batch,
        tokens_fed=1,
        context_len=context_len,
        logits_positions=1,
        experts_touched=touched,
    )
    return {"bytes": cost.bound_bytes, "flops": cost.total_flops}


def dense_costs(lm: LoadedModel, cost: dict, touched: list[int], batch: int) -> dict[str, dict]:
    """The same step on dense models of the MoE's total size (every expert read and computed by
    every token) and of its active size (k experts' weights, whatever the batch), modelled from
    the MoE step's `cost` with `touched` experts per layer."""
    shape = costs.shape_of(lm.info)
    e, k = shape.experts, shape.top_k
    one = shape.expert_params * shape.bytes_per_value  # bytes of one expert of one layer
    extra_flops = 2.0 * batch * shape.moe_layers * (e - k) * shape.expert_matmul_params
    return {
        "total": {
            "bytes": cost["bytes"] + sum(e - t for t in touched) * one,
            "flops": cost["flops"] + extra_flops,
        },
        "active": {
            "bytes": cost["bytes"] - sum(t - k for t in touched) * one,
            "flops": cost["flops"],
        },
    }


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
    check_batch_memory(lm, batches, context_len)
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
    extra["fed"] = fed_text(lm, batches, context_len)
    return frame(
        rows,
        COLUMNS,
        attrs("moe", lm, peaks, notes, COLUMNS, repeats=repeats, warmup=1, **extra),
    )


def batch_bytes(info, batch: int, context_len: int) -> float:
    """Modelled bytes of one point: the decode pass at this batch (the batch sweep's
    batch_memory_bytes) plus the prefill of batch x context_len tokens' activations."""
    from explorer.sweeps.batch_size import batch_memory_bytes

    prefill = (
        batch * context_len * costs.shape_of(info).act_elems * costs.shape_of(info).bytes_per_value
    )
    return batch_memory_bytes(info, batch, context_len) + prefill


def check_batch_memory(lm: LoadedModel, batches: list[int], context_len: int) -> None:
    """NotEnoughMemory (one line) before any point when the largest batch would not fit what the
    device has free, naming the largest batch that would (explorer.model.memory.check_fits)."""
    from explorer.model.memory import check_fits, fits

    top = max(batches)
    ok = [b for b in batches if fits(batch_bytes(lm.info, b, context_len), lm.device)]
    offer = f"batches up to {max(ok)} fit" if ok else "try smaller batches"
    check_fits(batch_bytes(lm.info, top, context_len), lm.device, f"--batches {top}", offer)


def text_windows(lm: LoadedModel, length: int) -> list[list[int]]:
    """Windows of `length` token ids cut from the held-out documents (text the bundled models
    never trained on), in order; [] without a tokenizer."""
    if lm.tokenizer is None:
        return []
    from explorer.model.corpus import heldout_documents

    windows = []
    for doc in heldout_documents():
        ids = lm.tokenizer(doc, verbose=False)["input_ids"]
        windows += [ids[i : i + length] for i in range(0, len(ids) - length + 1, length)]
    return windows


def batch_rows(lm: LoadedModel, batch: int, length: int, seed: int) -> torch.Tensor:
    """[batch, length] token ids: held-out text windows when the model has a tokenizer and there
    are enough of them (a trained router routes real text, not random ids), else seeded random ids.
    Row i is the same at every batch size, so a batch's rows are a prefix of a larger one's."""
    windows = lm.__dict__.setdefault("_moe_windows", {})
    if length not in windows:
        windows[length] = text_windows(lm, length)
    if len(windows[length]) >= batch:
        return torch.tensor(windows[length][:batch], device=lm.device)
    return token_ids(lm.info, batch, length, lm.device, seed)


def fed_text(lm: LoadedModel, batches: list[int], length: int) -> str:
    windows = lm.__dict__.get("_moe_windows", {}).get(length, [])
    if windows and len(windows) >= max(batches):
        return "held-out text (explorer.model.corpus), one window per row, the next token fed"
    return "seeded random token ids"


def _row(lm: LoadedModel, peaks, B: int, context_len: int, repeats: int, seed: int, tick) -> dict:
    experts, k = lm.info.num_experts, lm.info.experts_per_token
    rows = batch_rows(lm, B, context_len, seed)  # [B, L]: distinct rows
    cache = prefill_cache(lm.model, rows[:, :-1])
    feed = rows[:, -1:]  # [B, 1]
    past = cache.get_seq_length()
    with capture(lm.model) as routers_seen:  # the router's choice, on an untimed pass
        forward(lm.model, feed, cache, last_only=True)
    touched = routers_seen.record(choices=False)["experts_touched"]
    crop_cache(cache, past)
    timed = time_decode(
        lm.model, cache, feed, repeats=repeats, warmup=1, device=lm.device, tick=tick
    )
    seconds = timed.estimate
    cost = step_cost(lm, B, context_len, touched)
    dense = dense_costs(lm, cost, touched, B)
    total, active = dense["total"], dense["active"]
    split = utilisation(cost["flops"], cost["bytes"], seconds, peaks)
    return {
        "batch": B,
        "context_len": context_len,
        "experts": experts,
        "experts_per_token": k,
        "experts_touched": statistics.mean(touched),
        "experts_touched_per_layer": touched,
        "experts_touched_formula": experts_touched_expected(experts, k, B),
        "bytes_per_step": cost["bytes"],
        "flops_per_token_modelled": cost["flops"] / B,
        "ms_per_step": seconds * 1e3,
        **noise_columns(timed),
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
