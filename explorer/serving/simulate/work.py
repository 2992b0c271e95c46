"""One iteration's work: the one function every step model, the verdict and the what-if read.

An iteration is a list of passes, one per request in the batch: [query tokens, past KV tokens]
(a decoding request is [1, its context so far]; a prefill chunk is [chunk, tokens already
cached]). At a Footprint (bytes per weight read, per routed expert, per cached token: the
precision the model is stored in, and how many GPUs share it), its work is

    weight bytes  every weight once (a mixture of experts: of its routed experts only those the
                  iteration's tokens touch, E x (1 - (1 - k/E)^tokens) per MoE layer, uniform
                  routing), read by one fused GEMM over all the iteration's tokens
    KV bytes      K/V read for each pass's past and written for its query, at the KV dtype;
                  split into the decode passes' (one query token) and the prefill passes'
    GEMM FLOPs    2 per matmul weight a token uses (k experts) per query token, + one logit row
                  per pass (2 x hidden x vocab)
    attention     4 x heads x head_dim FLOPs per (query, key) pair per layer, per pass kind

and, over `tp` GPUs in tensor parallel, each GPU does 1/tp of all of it (Footprint.tp).
steptime.iteration_work and whatif.chip_work are this function under their old names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from explorer.costs.parts import Shape


@dataclass(frozen=True)
class Footprint:
    """Bytes the work is counted at: every weight once as one iteration reads it, one routed
    expert of one layer (0: dense), K and V of one token (all layers), and the GPUs sharing them.
    Footprint.native(shape) is the model as loaded here (its own dtype and KV dtype)."""

    weight_bytes: float
    kv_bytes_per_token: float
    expert_bytes: float = 0.0
    tp: int = 1

    @classmethod
    def native(cls, shape: Shape) -> Footprint:
        b = shape.bytes_per_value
        return cls(
            weight_bytes=float(sum(shape.weight_bytes_by_part().values())),
            kv_bytes_per_token=float(shape.kv_bytes_per_token),
            expert_bytes=float(shape.expert_params * b) if shape.is_moe else 0.0,
        )


@dataclass(frozen=True)
class Work:
    """One iteration's work (whole iteration; per GPU: divide by `tp`). `w["bytes"]` reads a
    field by name, the spelling the dict this replaced used."""

    weight_bytes: float
    kv_bytes_decode: float
    kv_bytes_prefill: float
    gemm_flops: float
    attn_flops_decode: float
    attn_flops_prefill: float
    requests: float
    tokens: float
    mask: float  # mixed batches: query x key tokens of one dense mask (transformers' engine)
    gemm_bytes: float  # weight bytes when 2+ query tokens (matrix-matrix kernels)
    tp: int = 1

    @property
    def kv_bytes(self) -> float:
        return self.kv_bytes_decode + self.kv_bytes_prefill

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops(self) -> float:
        return self.gemm_flops + self.attn_flops_decode + self.attn_flops_prefill

    def __getitem__(self, key: str) -> float:
        return getattr(self, key)

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "bytes": self.bytes, "flops": self.flops}


def weights_read(shape: Shape, tokens: int, weights: float, one_expert: float) -> float:
    """Weight bytes an iteration of `tokens` tokens reads: `weights` (every weight once) for a
    dense model; for a mixture of experts the routed experts it does not touch are taken out,
    E x (1 - (1 - k/E)^tokens) touched per MoE layer for uniform routing (one_expert: the bytes
    of one expert of one layer)."""
    if not shape.is_moe:
        return weights
    idle = shape.experts - shape.experts_touched(tokens)
    return weights - shape.moe_layers * idle * one_expert


def iteration_work(shape: Shape, passes, footprint: Footprint | None = None) -> Work:
    """The work of one iteration of `passes` at `footprint` (None: the model as loaded here)."""
    fp = footprint or Footprint.native(shape)
    per_pair = 4.0 * shape.layers * shape.heads * shape.head_dim
    query = past = 0
    kv_tokens = [0, 0]  # decode, prefill
    pairs = [0, 0]
    for q, p in passes:
        kind = 0 if q == 1 else 1
        query += q
        past += p
        kv_tokens[kind] += p + q
        pairs[kind] += q * (p + q)
    weights = weights_read(shape, query, fp.weight_bytes, fp.expert_bytes)
    gemm = 2.0 * shape.matmul_params_per_token * query
    gemm += 2.0 * len(passes) * shape.hidden * shape.vocab
    mixed = any(q > 1 for q, _ in passes)
    return Work(
        weight_bytes=float(weights),
        kv_bytes_decode=float(fp.kv_bytes_per_token * kv_tokens[0]),
        kv_bytes_prefill=float(fp.kv_bytes_per_token * kv_tokens[1]),
        gemm_flops=gemm,
        attn_flops_decode=per_pair * pairs[0],
        attn_flops_prefill=per_pair * pairs[1],
        requests=float(len(passes)),
        tokens=float(query),
        mask=float(query * (past + query)) if mixed else 0.0,
        gemm_bytes=float(weights) if query > 1 else 0.0,
        tp=fp.tp,
    )
