"""The mixture-of-experts pieces of the cost model (explorer.costs.parts): the parameters of one
expert, the router and the shared experts, and the experts a pass reads (measured or expected)."""

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
