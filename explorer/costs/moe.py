"""The mixture-of-experts pieces of the cost model (explorer.costs.parts): the parameters of one
expert, the router and the shared experts, and the experts a pass reads (measured or expected).

Mixture of experts (ModelInfo.num_experts set; E experts per MoE layer, k per token, T = B*n tokens):

    weights/mlp             the dense MLPs of the layers that have no experts (0 when all are routed)
    weights/router          every router matrix [E, hidden] (and bias), read once per pass
    weights/experts         the experts the pass touches, per MoE layer: measured from the router
                            when the model ran (experts_touched, one count per MoE layer), else the
                            expectation for uniform routing E*(1 - (1 - k/E)^T) per layer; times the
                            bytes of one expert. At T = 1 that is k experts; as T grows, all E.
    weights/shared_experts  the experts every token uses (Qwen2-MoE, DeepSeek), read once per pass
    flops/router            2*T*hidden*E per MoE layer
    flops/experts           2*T*k*(one expert's matrix parameters) per MoE layer: only the active
                            experts compute, however many the batch touches
    flops/shared_experts    2*T*(shared expert matrix parameters) per MoE layer

Not modelled for MoE: sliding-window layers (gpt-oss's alternate layers keep only the last 128
positions, so its kv_read is overstated beyond 128 tokens) and any padding or capacity factor of an
expert kernel (grouped GEMM): each touched expert's weights are read once per pass.
"""

from __future__ import annotations


def moe_params(shape) -> dict[str, int]:
    """Per-layer parameter counts of a Shape's MoE parts (zeros for a dense model)."""
    h, ie, si = shape.hidden, shape.expert_inter, shape.shared_inter
    expert_mm = 3 * h * ie  # gate, up, down (SwiGLU)
    shared_mm = 3 * h * si
    return {
        "expert_params": expert_mm + (2 * ie + h if shape.mlp_bias else 0),
        "expert_matmul_params": expert_mm,
        "router_params": shape.experts * h + (shape.experts if shape.router_bias else 0),
        "shared_params": shared_mm + (h if si else 0),  # + the shared experts' gate [1, hidden]
        "shared_matmul_params": shared_mm + (h if si else 0),
    }


def experts_touched_sum(shape, tokens: int, measured: list[float] | None = None) -> float:
    """Experts read in one pass over all MoE layers: the measured count per layer, else
    moe_layers x E*(1 - (1 - k/E)^tokens)."""
    if measured is None:
        return shape.moe_layers * shape.experts_touched(tokens)
    if len(measured) != shape.moe_layers or any(
        not 0 <= t <= min(shape.experts, tokens * shape.top_k) for t in measured
    ):
        raise ValueError(
            f"experts_touched must give one count per MoE layer ({shape.moe_layers}), each in "
            f"0..min(E={shape.experts}, tokens x k={tokens * shape.top_k}); got {measured!r}"
        )
    return float(sum(measured))
