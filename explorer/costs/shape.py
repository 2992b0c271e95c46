"""The shape of a model as the cost model sees it: per-family structure (FAMILIES), the Shape of one
model (its sizes, parameter counts and stored bytes by part) and the whole-model parameter counts.

One idea: what a model *is*, counted from its ModelInfo; what one pass over it costs is
explorer.costs.parts (which re-exports these names).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from explorer.costs.kvdtype import kv_value_bytes
from explorer.costs.moe import moe_params
from explorer.model.loader import ModelInfo, dtype_bytes
from explorer.model.moe import experts_touched_expected

# Per-family structure the ModelInfo numbers do not say. Keys: MLP kind, norm kind, learned
# position embedding, biases on q/k/v, on the attention output, on the MLP matrices.
FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": dict(
        mlp="gelu",
        norm="layernorm",
        learned_positions=True,
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
    ),
    "llama": dict(
        mlp="swiglu",
        norm="rmsnorm",
        learned_positions=False,
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
    ),
    "mistral": dict(
        mlp="swiglu",
        norm="rmsnorm",
        learned_positions=False,
        qkv_bias=False,
        out_bias=False,
        mlp_bias=False,
    ),
    "qwen2": dict(
        mlp="swiglu",
        norm="rmsnorm",
        learned_positions=False,
        qkv_bias=True,
        out_bias=False,
        mlp_bias=False,
    ),
}
# Qwen3: Llama's structure plus an RMSNorm over each head's q and k (head_dim weights each)
FAMILIES["qwen3"] = {**FAMILIES["llama"], "qk_norm": True}
# Mixtures of experts: the dense family's attention, routed SwiGLU experts in the MLP's place
FAMILIES["mixtral"] = dict(FAMILIES["mistral"])
FAMILIES["qwen3_moe"] = dict(FAMILIES["qwen3"])
FAMILIES["qwen2_moe"] = dict(FAMILIES["qwen2"])
# gpt-oss: biases on q/k/v/o, on every expert matrix and on the router; one attention sink per head
FAMILIES["gpt_oss"] = {
    **FAMILIES["llama"],
    "qkv_bias": True,
    "out_bias": True,
    "mlp_bias": True,
    "router_bias": True,
    "sinks": True,
}


@dataclass(frozen=True)
class Shape:
    """Per-model constants of the cost model (derived once from ModelInfo, cached)."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    max_positions: int
    tied: bool
    bytes_per_value: int
    mlp: str
    norm: str
    learned_positions: bool
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    # bytes per matmul weight value by part (scales included): the dtype's size unless quantised
    linear_bytes: tuple[tuple[str, float], ...] = ()
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    # mixture of experts (0 / False for a dense model; explorer.model.moe):
    experts: int = 0  # routed experts per MoE layer (E)
    top_k: int = 0  # experts per token (k)
    expert_inter: int = 0  # one expert's MLP width
    moe_layers: int = 0  # layers whose MLP is routed; the other layers have a dense MLP of `inter`
    shared_inter: int = 0  # all shared experts' MLP width together (0: none)
    router_bias: bool = False
    sinks: bool = False  # one learned attention-sink logit per head (gpt-oss)
    # bytes per cached K/V value, scales included (explorer.costs.kvdtype); 0: bytes_per_value
    kv_value_bytes: float = 0.0
    # derived in __post_init__ (parameters per layer, matmul parameters per token):
    attn_params: int = field(init=False)
    attn_matmul_params: int = field(init=False)
    mlp_params: int = field(init=False)
    mlp_matmul_params: int = field(init=False)
    norm_params: int = field(init=False)
    act_elems: float = field(init=False)  # per token per layer (the MoE layers' own averaged in)
    expert_params: int = field(init=False)  # one routed expert, biases included
    expert_matmul_params: int = field(init=False)
    router_params: int = field(init=False)  # per MoE layer
    shared_params: int = field(init=False)  # per MoE layer (shared experts and their gate)
    shared_matmul_params: int = field(init=False)

    def __post_init__(self) -> None:
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.inter,
        )
        attn_mm = h * q + 2 * h * kv + q * h  # q, k, v, o matrices
        attn = attn_mm + (q + 2 * kv if self.qkv_bias else 0) + (h if self.out_bias else 0)
        attn += self.heads if self.sinks else 0
        n_mats = 3 if self.mlp == "swiglu" else 2
        mlp_mm = n_mats * h * i
        mlp = mlp_mm + ((n_mats - 1) * i + h if self.mlp_bias else 0)
        per_norm = 2 * h if self.norm == "layernorm" else h
        # Intermediate tensors per token per layer (elements written once, read once):
        # norm outs, o_proj out, residual adds (5 x hidden); q, k, v, rotated q/k, attention out;
        # MLP: gate, up, act, product (SwiGLU) or fc, act (GELU).
        acts = 5 * h + (2 * q + 3 * kv) + (4 * i if self.mlp == "swiglu" else 2 * i)
        moe = moe_params(self)
        if self.moe_layers:  # routed layers: router logits, k experts' and the shared MLPs
            moe_acts = acts - 4 * i + self.experts + 4 * (self.top_k * self.expert_inter)
            moe_acts += 4 * self.shared_inter
            dense = self.layers - self.moe_layers
            acts = (dense * acts + self.moe_layers * moe_acts) / self.layers
        for name, value in [
            *moe.items(),
            ("attn_params", attn),
            ("attn_matmul_params", attn_mm),
            ("mlp_params", mlp),
            ("mlp_matmul_params", mlp_mm),
            ("norm_params", 2 * per_norm + (2 * self.head_dim if self.qk_norm else 0)),
            ("act_elems", 2 * acts),
        ]:
            object.__setattr__(self, name, value)

    @property
    def final_norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token of one sequence, all layers, at the cache's dtype."""
        n = (
            2
            * self.layers
            * self.kv_heads
            * self.head_dim
            * (self.kv_value_bytes or self.bytes_per_value)
        )
        return int(n) if n == int(n) else n

    def with_kv_dtype(self, kv_dtype: str | None) -> Shape:
        """This shape with its KV cache stored at `kv_dtype` (None: the weights' dtype)."""
        if kv_dtype is None:
            return self
        return replace(self, kv_value_bytes=kv_value_bytes(kv_dtype, self.bytes_per_value))

    def parameters(self) -> int:
        return sum(parameter_counts(self).values())

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    @property
    def dense_mlp_layers(self) -> int:
        return self.layers - self.moe_layers

    def active_parameters(self) -> int:
        """Parameters one token uses: all but the (E - k) experts it is not routed to, per layer."""
        idle = self.moe_layers * (self.experts - self.top_k) * self.expert_params
        return self.parameters() - idle

    @property
    def matmul_params_per_token(self) -> float:
        """Matmul weights one token multiplies by (2 FLOPs each), all layers, LM head excluded:
        attention, dense MLPs, and per MoE layer the router, its k experts and the shared ones."""
        dense = (
            self.layers * self.attn_matmul_params + self.dense_mlp_layers * self.mlp_matmul_params
        )
        routed = self.experts * self.hidden + self.top_k * self.expert_matmul_params
        return float(dense + self.moe_layers * (routed + self.shared_matmul_params))

    @property
    def matmul_params(self) -> int:
        """Matmul weights stored, all layers (every expert), LM head excluded."""
        dense = (
            self.layers * self.attn_matmul_params + self.dense_mlp_layers * self.mlp_matmul_params
        )
        routed = self.experts * (self.hidden + self.expert_matmul_params)
        return dense + self.moe_layers * (routed + self.shared_matmul_params)

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one pass over `tokens` tokens reads, input embedding rows aside: every
        weight once, but of the routed experts only those the tokens touch (uniform routing)."""
        parts = self.weight_bytes_by_part()
        if self.is_moe:
            touched = self.moe_layers * self.experts_touched(tokens)
            parts["weights/experts"] = touched * self.expert_params * self.bytes_per_value
        return float(sum(parts.values()))

    def experts_touched(self, tokens: int) -> float:
        """Expected experts one MoE layer reads for `tokens` tokens routed uniformly (0: dense)."""
        if not self.is_moe:
            return 0.0
        return experts_touched_expected(self.experts, self.top_k, tokens)

    def matmul_bytes(self, part: str) -> float:
        """Bytes per matmul weight value of a part ("attention", "mlp", "lm_head")."""
        return dict(self.linear_bytes).get(part, float(self.bytes_per_value))

    def weight_bytes_by_part(self) -> dict[str, float]:
        """Bytes of every weight part as stored: matmul weights at their real size per value
        (int8 + scales when quantised), biases, norms and embeddings at the dtype's size."""
        b = self.bytes_per_value
        attn_bias = self.attn_params - self.attn_matmul_params
        mlp_bias = self.mlp_params - self.mlp_matmul_params
        out = {
            "weights/attention": self.layers
            * (self.attn_matmul_params * self.matmul_bytes("attention") + attn_bias * b),
            "weights/mlp": self.dense_mlp_layers
            * (self.mlp_matmul_params * self.matmul_bytes("mlp") + mlp_bias * b),
        }
        if (
            self.is_moe
        ):  # expert tensors are not nn.Linear: a weight quantiser leaves them as they are
            out["weights/router"] = float(self.moe_layers * self.router_params * b)
            out["weights/experts"] = float(self.moe_layers * self.experts * self.expert_params * b)
            if self.shared_params:
                out["weights/shared_experts"] = float(self.moe_layers * self.shared_params * b)
        out["weights/norms"] = float((self.layers * self.norm_params + self.final_norm_params) * b)
        out["weights/lm_head"] = self.vocab * self.hidden * self.matmul_bytes("lm_head")
        return out


def info_key(info: ModelInfo) -> tuple:
    """Every field of a ModelInfo the cost model reads: one key per distinct shape."""
    moe = (
        info.num_experts or 0,
        info.experts_per_token or 0,
        info.expert_intermediate_size or 0,
        info.moe_layers,
        info.shared_expert_intermediate_size or 0,
    )
    return (
        info.family,
        info.layers,
        info.hidden_size,
        info.attention_heads,
        info.kv_heads,
        info.head_dim,
        info.intermediate_size,
        info.vocab_size,
        info.max_positions,
        info.tied_embeddings,
        info.dtype,
        info.parameters,
        tuple(sorted((info.linear_bytes or {}).items())),
        moe,
    )


def shape_of(info: ModelInfo) -> Shape:
    """The cost-model Shape of a model (cached per distinct shape)."""
    return _shape(info_key(info))


@lru_cache(maxsize=64)
def _shape(key: tuple) -> Shape:
    family, layers, hidden, heads, kv, hd, inter, vocab, max_pos, tied, dtype, params, lin, moe = (
        key
    )
    if family not in FAMILIES:
        raise ValueError(
            f"no cost model for model family {family!r}; known families: {sorted(FAMILIES)}"
        )
    shape = Shape(
        family=family,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        inter=inter,
        vocab=vocab,
        max_positions=max_pos,
        tied=tied,
        bytes_per_value=dtype_bytes(dtype),
        **FAMILIES[family],
        linear_bytes=lin,
        **dict(zip(("experts", "top_k", "expert_inter", "moe_layers", "shared_inter"), moe)),
    )
    if shape.parameters() != params:
        warnings.warn(
            f"cost model counts {shape.parameters():,} parameters but the {family} model has {params:,}; "
            "its weight bytes are off by the difference",
            stacklevel=3,
        )
    return shape


# --- whole-model parameters ----------------------------------------------------------------------


def parameter_counts(shape: Shape) -> dict[str, int]:
    """Parameters by part (tied embeddings counted once, under weights/embedding)."""
    parts = {"weights/embedding": shape.vocab * shape.hidden}
    if shape.learned_positions:
        parts["weights/position_embedding"] = shape.max_positions * shape.hidden
    parts["weights/attention"] = shape.layers * shape.attn_params
    parts["weights/mlp"] = shape.dense_mlp_layers * shape.mlp_params
    if shape.is_moe:
        parts["weights/router"] = shape.moe_layers * shape.router_params
        parts["weights/experts"] = shape.moe_layers * shape.experts * shape.expert_params
        if shape.shared_params:
            parts["weights/shared_experts"] = shape.moe_layers * shape.shared_params
    parts["weights/norms"] = shape.layers * shape.norm_params + shape.final_norm_params
    parts["weights/lm_head"] = 0 if shape.tied else shape.vocab * shape.hidden
    return parts


def parameter_bytes(info: ModelInfo) -> dict[str, int]:
    """Bytes of the stored parameters by part; they add up to info.weight_bytes (tests check this)."""
    shape = shape_of(info)
    out = {k: v * shape.bytes_per_value for k, v in parameter_counts(shape).items()}
    stored = shape.weight_bytes_by_part()
    for k in ("weights/attention", "weights/mlp", "weights/norms"):
        out[k] = round(stored[k])
    if not shape.tied:
        out["weights/lm_head"] = round(stored["weights/lm_head"])
    return out
