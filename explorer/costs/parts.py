"""What one forward pass costs: modelled FLOPs and bytes moved, by named part, and its roofline.

Everything here is *modelled* (pure arithmetic on the model's shape); nothing is timed. The
formulas, for batch B, tokens fed n, context length L (cached prefix + fed), dtype size b:
(matmul weights count their real bytes per value instead of b when the model's weights are
quantised: an int8 weight is 1 byte plus its per-row scale and zero point, from ModelInfo.linear_bytes)

    weights/embedding       B*n rows gathered from the token embedding: B*n*hidden*b
    weights/position_embedding  (GPT-2's learned positions) B*n rows gathered: B*n*hidden*b
    weights/attention       every q/k/v/o matrix (and bias) of every layer, read once per pass
    weights/mlp             every MLP matrix (and bias) of every layer, read once per pass
    weights/norms           norm weights (and biases), tiny
    weights/lm_head         the whole [vocab, hidden] output matrix, read once per pass. With tied
                            embeddings it is the same matrix as the token embedding, counted once
                            here in full (the B*n rows gathered at the input are counted above).
    kv_read                 the cached prefix: 2*layers*kv_heads*head_dim*b*B*(L-n). The K/V just
                            computed for the n fed tokens are not counted as read again (an ideal
                            kernel uses them from registers/cache right after computing them).
    kv_write                the fed tokens' K/V: 2*layers*kv_heads*head_dim*b*B*n
                            (b for kv_read / kv_write: the cache's dtype, kv_dtype= fp8, int8, int4
                            with their scales, explorer.costs.kvdtype; default the weights')
    activations             an ESTIMATE: every intermediate tensor of a layer written once and read
                            once (see Shape.act_elems), plus the logits written and read back.

Mixture of experts (ModelInfo.num_experts set): weights/router, weights/experts (only the experts
the pass touches), weights/shared_experts and their flops/ parts, as explorer.costs.moe says.

Without a cache there is no KV read/write to memory: K and V of the whole sequence are
recomputed inside the pass (n == L), so the work moves to FLOPs, which grow with n*L.

The model's Shape (FAMILIES, Shape, shape_of, parameter counts) is its own room, explorer.costs.shape;
its names are re-exported here.

Not counted: DynamicCache grows by torch.cat, which copies the whole cache every step (a real
extra read+write of the prefix that a static, in-place cache avoids); the model is the ideal.

FLOPs (2 per multiply-add; elementwise ops, norms, softmax and RoPE are not counted):

    flops/attention_proj    2*B*n*(q, k, v, o matrix parameters) per layer
    flops/mlp               2*B*n*(MLP matrix parameters) per layer
    flops/attention_scores  2*B*heads*head_dim*n*L for QK^T plus the same for AV, per layer
                            (the full n x L rectangle, as SDPA computes it; causal masking skips
                            none of it in the formula)
    flops/lm_head           2*B*n_logits*hidden*vocab (n_logits = n unless only the last
                            position's logits are computed)

Roofline: bound_s = max(flops / peak FLOP/s, bytes / peak bandwidth), a lower bound on latency
(peaks from explorer.costs.hardware: the best measured repeat, cache bandwidth when a pass's bytes fit
in the last-level cache; see Peaks.bandwidth_for). The bound and achieved_gbps count the bytes
that must cross the memory bus (weights and KV: `bound_bytes`); the activations estimate is shown
as a part but left out of both, because intermediate tensors often never leave on-chip caches and
a lower bound must not count traffic that may not happen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from explorer.costs.moe import experts_touched_sum
from explorer.costs.shape import (  # noqa: F401  (re-exported: imported from here)
    FAMILIES,
    Shape,
    parameter_bytes,
    parameter_counts,
    shape_of,
)
from explorer.model.loader import ModelInfo

PART_NOTES: dict[str, str] = {
    "weights/embedding": "modelled: B*n gathered rows of the token embedding",
    "weights/position_embedding": "modelled: B*n gathered rows of the learned position embedding",
    "weights/attention": "modelled: all q/k/v/o weights and biases, read once",
    "weights/mlp": "modelled: all MLP weights and biases, read once (MoE: the dense layers' only)",
    "weights/router": "modelled: every router matrix [experts, hidden], read once",
    "weights/experts": "modelled: the experts the pass touches per layer (measured from the router, else E*(1-(1-k/E)^tokens)) x one expert's bytes",
    "weights/shared_experts": "modelled: the experts every token uses, read once",
    "weights/norms": "modelled: all norm weights (and biases), read once",
    "weights/lm_head": "modelled: the whole output matrix, read once (tied: shared with the embedding, counted once)",
    "kv_read": "modelled: cached prefix K and V, 2*layers*kv_heads*head_dim*bytes*B*(L-n); fresh K/V not re-counted",
    "kv_write": "modelled: K and V of the fed tokens, 2*layers*kv_heads*head_dim*bytes*B*n",
    "activations": "estimate: each intermediate tensor written once and read once, plus the logits",
}


BOUND_EXCLUDES = ("activations",)  # parts shown but not counted in bound_s / achieved_gbps


def bound_bytes(parts: dict[str, float]) -> float:
    """Bytes the roofline counts: every part except the activations estimate."""
    return float(sum(v for k, v in parts.items() if k not in BOUND_EXCLUDES))


# --- one forward pass ----------------------------------------------------------------------------


def check_sizes(
    info: ModelInfo, batch: int, tokens_fed: int, context_len: int, use_cache: bool
) -> None:
    """Raise ValueError with a clear message for sizes that describe no real forward pass."""
    for name, value in (("batch", batch), ("tokens_fed", tokens_fed), ("context_len", context_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if tokens_fed > context_len:
        raise ValueError(f"tokens_fed ({tokens_fed}) cannot exceed context_len ({context_len})")
    if not use_cache and tokens_fed != context_len:
        raise ValueError(
            f"without a cache the whole sequence is fed: tokens_fed ({tokens_fed}) must equal "
            f"context_len ({context_len})"
        )
    info.check_context(context_len, f"context_len {context_len:,}")


def forward_bytes(
    shape: Shape,
    batch: int,
    tokens_fed: int,
    context_len: int,
    use_cache: bool,
    logits_positions: int,
    experts_touched: list[float] | None = None,
) -> dict[str, float]:
    """Bytes moved by one forward pass, by part (see the module docstring). experts_touched: the
    distinct experts each MoE layer read (measured); None: the uniform-routing expectation."""
    b, rows = shape.bytes_per_value, batch * tokens_fed
    parts = {"weights/embedding": float(rows * shape.hidden * b)}
    if shape.learned_positions:
        parts["weights/position_embedding"] = float(rows * shape.hidden * b)
    parts.update(shape.weight_bytes_by_part())  # matmul weights at their real bytes per value
    if shape.is_moe:  # only the experts touched are read
        touched = experts_touched_sum(shape, rows, experts_touched)
        parts["weights/experts"] = float(touched * shape.expert_params * b)
    per_tok = shape.kv_bytes_per_token
    parts["kv_read"] = float(per_tok * batch * (context_len - tokens_fed)) if use_cache else 0.0
    parts["kv_write"] = float(per_tok * batch * tokens_fed) if use_cache else 0.0
    logits = 2 * batch * logits_positions * shape.vocab * b  # written, then read back
    parts["activations"] = float(rows * shape.layers * shape.act_elems * b + logits)
    return parts


def forward_flops(
    shape: Shape, batch: int, tokens_fed: int, context_len: int, logits_positions: int
) -> dict[str, float]:
    """FLOPs of one forward pass, by part (matmuls and attention scores; see the module docstring)."""
    rows = batch * tokens_fed
    scores = 2 * 2 * batch * shape.heads * shape.head_dim * tokens_fed * context_len  # QK^T + AV
    out = {
        "flops/attention_proj": 2.0 * rows * shape.layers * shape.attn_matmul_params,
        "flops/attention_scores": float(shape.layers * scores),
        "flops/mlp": 2.0 * rows * shape.dense_mlp_layers * shape.mlp_matmul_params,
    }
    if shape.is_moe:  # each token computes with its k experts only
        m = shape.moe_layers
        out["flops/router"] = 2.0 * rows * m * shape.hidden * shape.experts
        out["flops/experts"] = 2.0 * rows * m * shape.top_k * shape.expert_matmul_params
        if shape.shared_matmul_params:
            out["flops/shared_experts"] = 2.0 * rows * m * shape.shared_matmul_params
    out["flops/lm_head"] = 2.0 * batch * logits_positions * shape.hidden * shape.vocab
    return out


class _Totals:
    """total_flops / total_bytes of a cost whose `flops` and `bytes` are dicts by part."""

    flops: dict[str, float]
    bytes: dict[str, float]

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops.values()))

    @property
    def total_bytes(self) -> float:
        return float(sum(self.bytes.values()))


@dataclass
class ForwardCost(_Totals):
    """Modelled cost of one forward pass: FLOPs and bytes by part."""

    flops: dict[str, float]
    bytes: dict[str, float]
    batch: int
    tokens_fed: int
    context_len: int
    use_cache: bool

    @property
    def bound_bytes(self) -> float:
        """Bytes the roofline counts (weights and KV; not the activations estimate)."""
        return bound_bytes(self.bytes)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte the roofline counts."""
        return self.total_flops / self.bound_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "tokens_fed": self.tokens_fed,
            "context_len": self.context_len,
            "use_cache": self.use_cache,
            "flops": dict(self.flops),
            "bytes": dict(self.bytes),
            "total_flops": self.total_flops,
            "total_bytes": self.total_bytes,
            "bound_bytes": self.bound_bytes,
            "intensity": self.intensity,
        }


def forward_cost(
    info: ModelInfo,
    *,
    batch: int,
    tokens_fed: int,
    context_len: int,
    use_cache: bool = True,
    logits_positions: int | None = None,
    experts_touched: list[float] | None = None,
    kv_dtype: str | None = None,
) -> ForwardCost:
    """Modelled FLOPs and bytes of one forward pass by part. logits_positions: positions whose logits
    are computed (default: all fed tokens, as a plain forward does; 1 with logits_to_keep=1).
    experts_touched (MoE): distinct experts each MoE layer read in this pass, as the router chose
    them (explorer.engine.routing); None: the uniform-routing expectation. kv_dtype: the KV
    cache's dtype (explorer.costs.kvdtype; default the weights')."""
    check_sizes(info, batch, tokens_fed, context_len, use_cache)
    n_logits = tokens_fed if logits_positions is None else logits_positions
    if not 1 <= n_logits <= tokens_fed:
        raise ValueError(
            f"logits_positions must be in 1..tokens_fed ({tokens_fed}), got {logits_positions!r}"
        )
    shape = shape_of(info).with_kv_dtype(kv_dtype)
    return ForwardCost(
        flops=forward_flops(shape, batch, tokens_fed, context_len, n_logits),
        bytes=forward_bytes(
            shape, batch, tokens_fed, context_len, use_cache, n_logits, experts_touched
        ),
        batch=batch,
        tokens_fed=tokens_fed,
        context_len=context_len,
        use_cache=use_cache,
    )


# --- roofline ------------------------------------------------------------------------------------


def roofline(flops: float, nbytes: float, peaks) -> tuple[float, str]:
    """Lower-bound time max(flops / peak FLOP/s, bytes / peak bandwidth) and which side binds."""
    compute_s = flops / peaks.roofline_flops
    memory_s = nbytes / (peaks.bandwidth_for(nbytes) * 1e9)
    return (memory_s, "memory") if memory_s >= compute_s else (compute_s, "compute")


# --- whole generations and batch knees ------------------------------------------------------------


def generation_steps(prompt_len: int, new_tokens: int, use_cache: bool) -> list[tuple[int, int]]:
    """(tokens_fed, context_len) of each forward pass that generates `new_tokens` tokens: the prefill
    makes the first, then one decode pass per further token (fed 1 with a cache, everything without)."""
    steps = [(prompt_len, prompt_len)]
    for k in range(1, new_tokens):
        context = prompt_len + k
        steps.append((1 if use_cache else context, context))
    return steps


@dataclass
class GenerationCost(_Totals):
    """Modelled totals of a whole generation (prefill + decode passes), with or without the cache."""

    use_cache: bool
    prompt_len: int
    new_tokens: int
    batch: int
    flops: dict[str, float]  # summed over passes, by part
    bytes: dict[str, float]
    per_step_flops: list[float]
    per_step_bytes: list[float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "use_cache": self.use_cache,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "batch": self.batch,
            "flops": dict(self.flops),
            "bytes": dict(self.bytes),
            "total_flops": self.total_flops,
            "total_bytes": self.total_bytes,
        }


def generation_cost(
    info: ModelInfo,
    *,
    prompt_len: int,
    new_tokens: int,
    batch: int = 1,
    use_cache: bool = True,
    last_logits_only: bool = True,
    kv_dtype: str | None = None,
) -> GenerationCost:
    """Modelled FLOPs and bytes of generating `new_tokens` after a `prompt_len` prompt. Without the cache
    every pass recomputes the whole prefix, so the total grows quadratically in the length.
    last_logits_only: the LM head runs on the last position only (as generate() and Session do)."""
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise ValueError(f"new_tokens must be a whole number >= 1, got {new_tokens!r}")
    check_sizes(info, batch, prompt_len, prompt_len + new_tokens - 1, True)
    flops: dict[str, float] = {}
    nbytes: dict[str, float] = {}
    per_flops, per_bytes = [], []
    for fed, context in generation_steps(prompt_len, new_tokens, use_cache):
        cost = forward_cost(
            info,
            batch=batch,
            tokens_fed=fed,
            context_len=context,
            use_cache=use_cache,
            logits_positions=1 if last_logits_only else None,
            kv_dtype=kv_dtype,
        )
        for k, v in cost.flops.items():
            flops[k] = flops.get(k, 0.0) + v
        for k, v in cost.bytes.items():
            nbytes[k] = nbytes.get(k, 0.0) + v
        per_flops.append(cost.total_flops)
        per_bytes.append(cost.total_bytes)
    return GenerationCost(
        use_cache=use_cache,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        batch=batch,
        flops=flops,
        bytes=nbytes,
        per_step_flops=per_flops,
        per_step_bytes=per_bytes,
    )


def decode_knee(
    info: ModelInfo, *, context_len: int, peaks, max_batch: int = 1 << 16
) -> int | None:
    """Smallest batch at which one decode step (1 token per row at `context_len`) becomes compute-bound
    on `peaks`, or None if it stays memory-bound up to max_batch (long contexts: the KV read per row
    grows as fast as the FLOPs per row). Modelled."""

    def compute_bound(b: int) -> bool:
        cost = forward_cost(info, batch=b, tokens_fed=1, context_len=context_len)
        return roofline(cost.total_flops, cost.bound_bytes, peaks)[1] == "compute"

    if not compute_bound(max_batch):
        return None
    lo, hi = 0, max_batch  # memory-bound at lo (or lo == 0), compute-bound at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi
