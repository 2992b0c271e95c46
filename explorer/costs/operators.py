"""One forward pass as its operators in order, each with its shapes, FLOPs and bytes (modelled).

The parts of explorer.costs.parts are sums of these operators: for every part, the operators'
bytes (flops) with that part's key add up to the part's value (tests/costs/test_operators.py
checks it for every bundled and arch: model). One layer, as the families the cost model knows run
it (Llama / Mistral / Qwen2 / Qwen3, GPT-2, Mixtral, Qwen3-MoE, gpt-oss):

    attn_norm, q_proj, k_proj, v_proj (GPT-2: one fused qkv_proj), q_norm, k_norm (Qwen3), rope
    (not GPT-2: its positions are learned), kv_write, attention (SDPA / flash: one fused op) or
    qk_scores, softmax, attn_v (eager), o_proj, attn_residual, mlp_norm, then
    gate_proj, up_proj, act_mul, down_proj (SwiGLU) | fc, gelu, proj (GPT-2) |
    router, topk, experts_gate_up, experts_act, experts_down, shared_expert, combine (MoE), and
    mlp_residual.
Around the layers: embed_tokens (embed_positions), final_norm, lm_head, and the sampling chain
(sampling/processors, sampling/softmax, sampling/draw).

Each operator holds the bytes it moves by the cost model's part keys (weights/..., kv_read,
kv_write, activations) and its FLOPs under one flops/ key, per instance; `count` says how many
instances one pass runs (layers). As in the parts, FLOPs are matmul and attention-score FLOPs
only (elementwise ops count 0), the KV read sits on the op that reads it (QK^T reads K, attn x V
reads V; the fused op both), and the activations estimate (each intermediate written once and read
once, explorer.costs.parts.Shape.act_elems) sits on the op that writes the tensor. That estimate
leaves the attention output out, and counts a rotated copy of q and k for every family (GPT-2
included: there it sits on the attention op). Bytes beyond the part model use their own keys:
`scores` (eager attention writes the n x L score matrix and softmax reads it back; a fused kernel
keeps it on chip), `attention_io` (attention reads q and the fed tokens' K and V and writes its
output, which the estimate leaves out), `sampling` (the chain reads and writes the logits),
`allreduce` (tensor parallel, explorer.costs.optime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from explorer.costs.moe import experts_touched_sum
from explorer.costs.parts import FAMILIES, Shape, check_sizes, shape_of

EXTRA_BYTES = (
    "scores",
    "attention_io",
    "sampling",
    "allreduce",
)  # byte keys that are not parts of parts.py
STAGES = ("embedding", "layer", "final", "head", "sampling")


class UnknownFamily(ValueError):
    """A model family with no operator list; the message says what can be drawn instead."""


@dataclass(frozen=True)
class Op:
    """One operator of a forward pass (per instance; `count` instances per pass)."""

    name: str
    stage: str  # embedding | layer | final | head | sampling
    kind: str  # embedding | norm | matmul | attention | elementwise | kv | router | sampling | comm
    part: str  # the profiler's part it runs inside (explorer.costs.profile.PARTS)
    what: str  # one sentence: what it does
    shapes: str  # its tensors' shapes for this pass
    flops: float = 0.0
    flop_part: str | None = None
    bytes: dict[str, float] = field(default_factory=dict)
    count: int = 1
    block: str = "attention"  # within a layer: attention | mlp (the picture's two halves)

    @property
    def total_flops(self) -> float:
        return self.flops * self.count

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values()) * self.count

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "kind": self.kind,
            "part": self.part,
            "block": self.block,
            "what": self.what,
            "shapes": self.shapes,
            "count": self.count,
            "flops": self.flops,
            "flop_part": self.flop_part,
            "bytes": dict(self.bytes),
        }


@dataclass
class OpTable:
    """The operators of one forward pass, in the order they run."""

    model: str
    family: str
    dtype: str
    batch: int
    tokens_fed: int
    context_len: int
    use_cache: bool
    fused_attention: bool
    ops: list[Op]
    kv_dtype: str | None = None

    @property
    def phase(self) -> str:
        return "prefill" if self.tokens_fed == self.context_len else "decode"

    def layer_ops(self) -> list[Op]:
        return [op for op in self.ops if op.stage == "layer"]

    def part_bytes(self) -> dict[str, float]:
        """Bytes by the parts' keys, summed over operators (EXTRA_BYTES left out)."""
        out: dict[str, float] = {}
        for op in self.ops:
            for key, value in op.bytes.items():
                if key not in EXTRA_BYTES:
                    out[key] = out.get(key, 0.0) + value * op.count
        return out

    def part_flops(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for op in self.ops:
            if op.flop_part:
                out[op.flop_part] = out.get(op.flop_part, 0.0) + op.total_flops
        return out


def _mm(rows: int, k: int, n: int) -> str:
    return f"x [{rows}, {k}] · W [{k}, {n}] -> [{rows}, {n}]"


class _Builder:
    """Builds the op list of one pass from a Shape (one method per stretch of the pass)."""

    def __init__(self, shape: Shape, batch, fed, context, use_cache, n_logits, touched, fused):
        self.s, self.B, self.n, self.L = shape, batch, fed, context
        self.rows, self.b = batch * fed, shape.bytes_per_value
        self.use_cache, self.n_logits, self.touched, self.fused = (
            use_cache,
            n_logits,
            touched,
            fused,
        )
        self.q, self.kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        self.kvb = shape.kv_value_bytes or shape.bytes_per_value
        self.ops: list[Op] = []

    def act(self, elems: float) -> float:
        """Activation bytes of a tensor of `elems` values per token, written once and read once."""
        return 2.0 * self.rows * elems * self.b

    def add(self, name, stage, kind, part, what, shapes, flops=0.0, flop_part=None, **kw) -> None:
        nbytes = {k: float(v) for k, v in kw.pop("nbytes", {}).items()}
        self.ops.append(Op(name, stage, kind, part, what, shapes, float(flops), flop_part,
                           nbytes, **kw))  # fmt: skip

    def embedding(self) -> None:
        s, rows = self.s, self.rows
        gather = rows * s.hidden * self.b
        self.add("embed_tokens", "embedding", "embedding", "embedding",
                 "Looks up one row of the token embedding table per fed token.",
                 f"ids [{self.B}, {self.n}] -> [{rows}, {s.hidden}] from [{s.vocab}, {s.hidden}]",
                 nbytes={"weights/embedding": gather})  # fmt: skip
        if s.learned_positions:
            self.add("embed_positions", "embedding", "embedding", "embedding",
                     "Adds the learned embedding of each token's position.",
                     f"positions [{self.n}] -> [{rows}, {s.hidden}]",
                     nbytes={"weights/position_embedding": gather})  # fmt: skip

    def norm(self, name: str, block: str, count: int) -> None:
        s = self.s
        per = 2 * s.hidden if s.norm == "layernorm" else s.hidden
        kind = "LayerNorm" if s.norm == "layernorm" else "RMSNorm"
        self.add(name, "layer", "norm", "norms",
                 f"{kind}: rescales each token's hidden vector before the {block}.",
                 f"[{self.rows}, {s.hidden}] -> [{self.rows}, {s.hidden}]",
                 nbytes={"weights/norms": per * self.b, "activations": self.act(s.hidden)},
                 count=count, block=block)  # fmt: skip

    def proj(self, name, what, k, n, bias, part_key, count, block, acts, flop_part) -> None:
        s = self.s
        mb = s.matmul_bytes(part_key)
        weights = k * n * mb + (n * self.b if bias else 0)
        weight_key = f"weights/{part_key}"
        profile_part = "attention/proj" if part_key == "attention" else "mlp"
        self.add(name, "layer", "matmul", profile_part, what, _mm(self.rows, k, n),
                 2.0 * self.rows * k * n, flop_part,
                 nbytes={weight_key: weights, "activations": self.act(acts)},
                 count=count, block=block)  # fmt: skip

    def attention_block(self) -> None:
        s, L, h, q, kv = self.s, self.s.layers, self.s.hidden, self.q, self.kv
        self.norm("attn_norm", "attention", L)
        fp = "flops/attention_proj"
        if s.family == "gpt2":
            self.proj("qkv_proj", "One fused matmul (c_attn) makes every token's query, key and "
                      "value.", h, q + 2 * kv, s.qkv_bias, "attention", L, "attention",
                      q + 2 * kv, fp)  # fmt: skip
        else:
            for name, n, what in (("q_proj", q, "query"), ("k_proj", kv, "key"),
                                  ("v_proj", kv, "value")):  # fmt: skip
                self.proj(name, f"Matmul: each token's {what} vectors, all heads.", h, n,
                          s.qkv_bias, "attention", L, "attention", n, fp)  # fmt: skip
        if s.qk_norm:
            for name in ("q_norm", "k_norm"):
                self.add(name, "layer", "norm", "attention/core",
                         f"RMSNorm over each head's {name[0]} vector (Qwen3).",
                         f"[{self.rows}, heads, {s.head_dim}]",
                         nbytes={"weights/norms": s.head_dim * self.b}, count=L)  # fmt: skip
        rotated = self.act(q + kv)  # the estimate's rotated copy of q and k
        if not s.learned_positions:
            self.add("rope", "layer", "elementwise", "attention/core",
                     "Rotates q and k by each token's position (RoPE).",
                     f"q [{self.rows}, {q}], k [{self.rows}, {kv}]",
                     nbytes={"activations": rotated}, count=L)  # fmt: skip
            rotated = 0.0
        self.kv_write()
        self.core(rotated)
        self.proj("o_proj", "Matmul: mixes the heads' outputs back into the hidden size.", q, h,
                  s.out_bias, "attention", L, "attention", h, fp)  # fmt: skip
        self.residual("attn_residual", "attention")

    def kv_write(self) -> None:
        s = self.s
        per_tok = 2 * s.kv_heads * s.head_dim * self.kvb * self.B
        written = per_tok * self.n if self.use_cache else 0.0
        self.add("kv_write", "layer", "kv", "attention/kv_update",
                 "Appends the fed tokens' K and V to the cache."
                 if self.use_cache else "No cache: K and V are not stored.",
                 f"K, V [{self.B}, {s.kv_heads}, {self.n}, {s.head_dim}] at {self.kvb:g} B/value",
                 nbytes={"kv_write": written}, count=s.layers)  # fmt: skip

    def core(self, rotated: float) -> None:
        s, B, n, L = self.s, self.B, self.n, self.L
        one = 2.0 * B * s.heads * s.head_dim * n * L  # QK^T (or attn x V)
        half_kv = s.kv_heads * s.head_dim * self.kvb * B * (L - n) if self.use_cache else 0.0
        fp = "flops/attention_scores"
        q_shape = f"q [{B}, {s.heads}, {n}, {s.head_dim}]"
        k_shape = f"K, V [{B}, {s.kv_heads}, {L}, {s.head_dim}]"
        sinks = {"weights/attention": s.heads * self.b} if s.sinks else {}
        io = self.rows * (self.q + self.kv) * self.b  # q in + output out, or fresh K + V in
        if self.fused:
            self.add("attention", "layer", "attention", "attention/core",
                     "Fused attention (SDPA / flash): scores q·K, softmax and the weighted sum of V "
                     "without writing the scores to memory.", f"{q_shape} over {k_shape}",
                     2 * one, fp, nbytes={"kv_read": 2 * half_kv, "activations": rotated,
                                         "attention_io": 2 * io, **sinks},
                     count=s.layers)  # fmt: skip
            return
        scores = 2.0 * B * s.heads * n * L * self.b  # the score matrix written once, read once
        self.add("qk_scores", "layer", "attention", "attention/core",
                 "Scores: each query against every cached key (q·K^T).",
                 f"{q_shape} · K^T -> scores [{B}, {s.heads}, {n}, {L}]", one, fp,
                 nbytes={"kv_read": half_kv, "activations": rotated, "scores": scores / 2,
                         "attention_io": io},
                 count=s.layers)  # fmt: skip
        self.add("softmax", "layer", "elementwise", "attention/core",
                 "Softmax over the context turns scores into attention weights.",
                 f"[{B}, {s.heads}, {n}, {L}]", nbytes={"scores": scores, **sinks},
                 count=s.layers)  # fmt: skip
        self.add("attn_v", "layer", "attention", "attention/core",
                 "Weighted sum of the cached values by the attention weights.",
                 f"weights [{B}, {s.heads}, {n}, {L}] · V -> [{B}, {s.heads}, {n}, {s.head_dim}]",
                 one, fp, nbytes={"kv_read": half_kv, "scores": scores / 2, "attention_io": io},
                 count=s.layers)  # fmt: skip

    def residual(self, name: str, block: str) -> None:
        h = self.s.hidden
        self.add(name, "layer", "elementwise", "residual/other",
                 f"Adds the {block} output back onto the residual stream.",
                 f"[{self.rows}, {h}] + [{self.rows}, {h}]",
                 nbytes={"activations": self.act(h)}, count=self.s.layers, block=block)  # fmt: skip

    def dense_mlp(self, count: int) -> None:
        s, h, i, fp = self.s, self.s.hidden, self.s.inter, "flops/mlp"
        if s.mlp == "swiglu":
            self.proj("gate_proj", "Matmul: the gate of the SwiGLU MLP.", h, i, s.mlp_bias, "mlp",
                      count, "mlp", i, fp)  # fmt: skip
            self.proj("up_proj", "Matmul: the up projection of the SwiGLU MLP.", h, i, s.mlp_bias,
                      "mlp", count, "mlp", i, fp)  # fmt: skip
            self.add("act_mul", "layer", "elementwise", "mlp", "SiLU of the gate times the up "
                     "projection.", f"[{self.rows}, {i}]", nbytes={"activations": self.act(2 * i)},
                     count=count, block="mlp")  # fmt: skip
            self.proj("down_proj", "Matmul: back down to the hidden size.", i, h, s.mlp_bias,
                      "mlp", count, "mlp", 0, fp)  # fmt: skip
            return
        self.proj("fc", "Matmul: up to the MLP width (c_fc).", h, i, s.mlp_bias, "mlp", count,
                  "mlp", i, fp)  # fmt: skip
        self.add("gelu", "layer", "elementwise", "mlp", "GELU on every value of the MLP's width.",
                 f"[{self.rows}, {i}]", nbytes={"activations": self.act(i)}, count=count,
                 block="mlp")  # fmt: skip
        self.proj("proj", "Matmul: back down to the hidden size (c_proj).", i, h, s.mlp_bias,
                  "mlp", count, "mlp", 0, fp)  # fmt: skip

    def mlp_block(self) -> None:
        self.norm("mlp_norm", "mlp", self.s.layers)
        if self.s.dense_mlp_layers:
            self.dense_mlp(self.s.dense_mlp_layers)
        if self.s.is_moe:
            from explorer.costs.opmoe import moe_ops

            moe_ops(self)
        self.residual("mlp_residual", "mlp")

    def head(self) -> None:
        s, b = self.s, self.b
        final = 2 * s.hidden if s.norm == "layernorm" else s.hidden
        self.add("final_norm", "final", "norm", "norms", "The last norm before the head.",
                 f"[{self.rows}, {s.hidden}]", nbytes={"weights/norms": final * b})  # fmt: skip
        logits = 2.0 * self.B * self.n_logits * s.vocab * b
        self.add("lm_head", "head", "matmul", "lm_head",
                 "Matmul: a score (logit) for every vocabulary token"
                 + (" (the embedding matrix, tied)." if s.tied else "."),
                 _mm(self.B * self.n_logits, s.hidden, s.vocab),
                 2.0 * self.B * self.n_logits * s.hidden * s.vocab, "flops/lm_head",
                 nbytes={"weights/lm_head": s.vocab * s.hidden * s.matmul_bytes("lm_head"),
                         "activations": logits})  # fmt: skip

    def sampling(self) -> None:
        logits = float(self.B * self.s.vocab * 4)  # float32 logits of the last position
        shape = f"[{self.B}, {self.s.vocab}]"
        for name, what in (
            ("processors", "Temperature, top-k, top-p, penalties: each rewrites the logits."),
            ("softmax", "Softmax turns the final logits into probabilities."),
            ("draw", "Draws the next token (or takes the argmax when greedy)."),
        ):
            self.add(f"sampling/{name}", "sampling", "sampling", "sampling", what, shape,
                     nbytes={"sampling": 2 * logits})  # fmt: skip


def operators(
    info,
    *,
    batch: int,
    tokens_fed: int,
    context_len: int,
    use_cache: bool = True,
    logits_positions: int | None = None,
    experts_touched: list[float] | None = None,
    kv_dtype: str | None = None,
    fused_attention: bool = True,
    shape: Shape | None = None,
) -> OpTable:
    """The operators of one forward pass, in order (arguments as explorer.costs.forward_cost's).
    fused_attention: SDPA / flash as one op (False: eager QK^T, softmax, attn x V); shape: a Shape
    to use instead of shape_of(info) (FP8 weights, explorer.costs.optime.fp8_shape)."""
    if info.family not in FAMILIES:
        raise UnknownFamily(
            f"no operator list for model family {info.family!r} (known: {', '.join(FAMILIES)}); "
            "drawn as whole parts instead: embedding, the layer stack, final norm, lm_head, sampling"
        )
    check_sizes(info, batch, tokens_fed, context_len, use_cache)
    n_logits = tokens_fed if logits_positions is None else logits_positions
    if not 1 <= n_logits <= tokens_fed:
        raise ValueError(f"logits_positions must be in 1..tokens_fed ({tokens_fed})")
    s = (shape or shape_of(info)).with_kv_dtype(kv_dtype)
    touched = None
    if s.is_moe:
        touched = experts_touched_sum(s, batch * tokens_fed, experts_touched) / s.moe_layers
    bld = _Builder(s, batch, tokens_fed, context_len, use_cache, n_logits, touched,
                   fused_attention)  # fmt: skip
    bld.embedding()
    bld.attention_block()
    bld.mlp_block()
    bld.head()
    bld.sampling()
    return OpTable(info.name, info.family, info.dtype, batch, tokens_fed, context_len, use_cache,
                   fused_attention, bld.ops, kv_dtype)  # fmt: skip


def coarse_operators(info, *, batch: int, tokens_fed: int, context_len: int) -> OpTable:
    """What can be drawn of a family with no operator list: the embedding, each layer as one box
    (its parameters read once, 2 FLOPs per parameter per token, its K/V read and written), the
    head and the sampling chain, from ModelInfo alone (modelled, coarsely)."""
    b = 2 if "16" in str(info.dtype) else 4
    h, V, L = info.hidden_size, info.vocab_size, info.layers
    rows = batch * tokens_fed
    per_layer = (info.parameters - V * h * (1 if info.tied_embeddings else 2)) / L
    kv = 2 * info.kv_heads * info.head_dim * b * batch
    ops = [
        Op("embed_tokens", "embedding", "embedding", "embedding",
           "Looks up one row of the token embedding table per fed token.",
           f"[{rows}, {h}]", 0.0, None, {"weights/embedding": float(rows * h * b)}),
        Op("layer", "layer", "matmul", "layer",
           f"One {info.family} layer, drawn whole: its operator list is not known here.",
           f"[{rows}, {h}] -> [{rows}, {h}]", 2.0 * rows * per_layer, "flops/layers",
           {"weights/layers": per_layer * b, "kv_read": float(kv * (context_len - tokens_fed)),
            "kv_write": float(kv * tokens_fed)}, L),
        Op("lm_head", "head", "matmul", "lm_head",
           "Matmul: a score (logit) for every vocabulary token.", _mm(batch, h, V),
           2.0 * batch * h * V, "flops/lm_head", {"weights/lm_head": float(V * h * b)}),
    ]  # fmt: skip
    shape = f"[{batch}, {V}]"
    ops += [Op(f"sampling/{n}", "sampling", "sampling", "sampling", w, shape, 0.0, None,
               {"sampling": 8.0 * batch * V}) for n, w in (
        ("processors", "Temperature, top-k, top-p, penalties: each rewrites the logits."),
        ("softmax", "Softmax turns the final logits into probabilities."),
        ("draw", "Draws the next token (or takes the argmax when greedy)."))]  # fmt: skip
    return OpTable(info.name, info.family, info.dtype, batch, tokens_fed, context_len, True,
                   True, ops)  # fmt: skip
