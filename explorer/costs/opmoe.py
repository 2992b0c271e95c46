"""The operators of a mixture-of-experts MLP (explorer.costs.operators): router, top-k, the experts
the tokens touch, the shared expert, the weighted combine. Bytes and FLOPs as explorer.costs.moe:
the experts' weights are read once per touched expert (measured from the router, or the
uniform-routing expectation), their FLOPs are each token's k experts only."""

from __future__ import annotations


def moe_ops(bld) -> None:
    """Append one MoE layer's operators to the builder `bld` (count: the MoE layers)."""
    s, rows, b, m = bld.s, bld.rows, bld.b, bld.s.moe_layers
    h, ei, E, k = s.hidden, s.expert_inter, s.experts, s.top_k
    bld.add("router", "layer", "router", "mlp",
            f"Matmul: a score for each of the {E} experts per token.", f"[{rows}, {h}] · [{h}, {E}]",
            2.0 * rows * h * E, "flops/router",
            nbytes={"weights/router": s.router_params * b, "activations": bld.act(E)},
            count=m, block="mlp")  # fmt: skip
    bld.add("topk", "layer", "elementwise", "mlp",
            f"Keeps each token's top {k} experts and their weights.", f"[{rows}, {E}] -> [{rows}, {k}]",
            count=m, block="mlp")  # fmt: skip
    touched = bld.touched  # experts one MoE layer reads (average over the MoE layers)
    bias = s.mlp_bias
    gate_up = 2 * h * ei + (2 * ei if bias else 0)
    down = ei * h + (h if bias else 0)
    which = f"{touched:.3g} experts touched of {E}"
    bld.add("experts_gate_up", "layer", "matmul", "mlp",
            f"Matmuls: gate and up projections of each token's {k} experts ({which}).",
            f"{rows} tokens x {k} experts: [1, {h}] · [{h}, 2 x {ei}]",
            2.0 * rows * k * 2 * h * ei, "flops/experts",
            nbytes={"weights/experts": touched * gate_up * b, "activations": bld.act(2 * k * ei)},
            count=m, block="mlp")  # fmt: skip
    bld.add("experts_act", "layer", "elementwise", "mlp",
            "SiLU of each expert's gate times its up projection.", f"[{rows} x {k}, {ei}]",
            nbytes={"activations": bld.act(2 * k * ei)}, count=m, block="mlp")  # fmt: skip
    bld.add("experts_down", "layer", "matmul", "mlp",
            f"Matmuls: each touched expert back down to the hidden size ({which}).",
            f"{rows} tokens x {k} experts: [1, {ei}] · [{ei}, {h}]",
            2.0 * rows * k * ei * h, "flops/experts",
            nbytes={"weights/experts": touched * down * b}, count=m, block="mlp")  # fmt: skip
    if s.shared_params:
        bld.add("shared_expert", "layer", "matmul", "mlp",
                "The shared expert every token uses (gate, up, down and its gate).",
                _shared_shape(rows, h, s.shared_inter), 2.0 * rows * s.shared_matmul_params,
                "flops/shared_experts",
                nbytes={"weights/shared_experts": s.shared_params * b,
                        "activations": bld.act(4 * s.shared_inter)},
                count=m, block="mlp")  # fmt: skip
    bld.add("combine", "layer", "elementwise", "mlp",
            "Sums the experts' outputs weighted by the router.", f"[{rows}, {k}, {h}] -> [{rows}, {h}]",
            count=m, block="mlp")  # fmt: skip


def _shared_shape(rows: int, h: int, inter: int) -> str:
    return f"[{rows}, {h}] · [{h}, {inter}] ... -> [{rows}, {h}]"
