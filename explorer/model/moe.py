"""Mixture-of-experts facts of a model: how many experts, how many a token uses, which modules route.

Read from the config (names differ by family: Qwen3-MoE's num_experts, Mixtral's and gpt-oss's
num_local_experts, DeepSeek's n_routed_experts) and from the module tree (the layers that hold
experts, the router modules, the expert tensors), so a dense model simply has none of them.

    active parameters = all parameters - (1 - k/E) x (routed expert parameters)

i.e. everything except the experts a token is not routed to (shared experts, routers, attention
and both embeddings count as active, as Mixtral's and Qwen3-MoE's published "active" figures do).
"""

from __future__ import annotations

from typing import Any

from torch import nn

DENSE_FACTS: dict[str, Any] = dict(
    num_experts=None,
    experts_per_token=None,
    expert_intermediate_size=None,
    moe_layers=0,
    shared_experts=0,
    shared_expert_intermediate_size=None,
)


def _first(config, *names: str):
    return next((getattr(config, n) for n in names if getattr(config, n, None)), None)


def is_router(module: nn.Module) -> bool:
    """transformers' top-k routers: Qwen3MoeTopKRouter, MixtralTopKRouter, GptOssTopKRouter, ..."""
    return type(module).__name__.endswith("Router")


def is_experts(module: nn.Module) -> bool:
    """The module holding one layer's routed experts (Qwen3MoeExperts, MixtralExperts, ...)."""
    return type(module).__name__.endswith("Experts")


def routers(model: nn.Module) -> list[nn.Module]:
    """The router of every MoE layer, in layer order ([] for a dense model)."""
    return [m for m in model.modules() if is_router(m)]


def moe_facts(model: nn.Module) -> dict[str, Any]:
    """num_experts, experts_per_token, expert_intermediate_size, moe_layers, shared_experts and
    shared_expert_intermediate_size of a model (DENSE_FACTS for a model without experts)."""
    config = model.config
    experts = _first(config, "num_experts", "num_local_experts", "n_routed_experts")
    moe_layers = sum(1 for m in model.modules() if is_experts(m))
    if not experts or not moe_layers:
        return dict(DENSE_FACTS)
    shared_width = _first(config, "shared_expert_intermediate_size")
    n_shared = _first(config, "n_shared_experts", "num_shared_experts") or (
        1 if shared_width else 0
    )
    width = _first(config, "moe_intermediate_size", "intermediate_size")
    return dict(
        num_experts=int(experts),
        experts_per_token=int(_first(config, "num_experts_per_tok", "experts_per_token")),
        expert_intermediate_size=int(width),
        moe_layers=moe_layers,
        shared_experts=int(n_shared),
        shared_expert_intermediate_size=(
            int(shared_width or n_shared * width) if n_shared else None
        ),
    )


def routed_expert_parameters(model: nn.Module) -> int:
    """Parameters of every routed expert of every layer (shared experts not included)."""
    seen: set[int] = set()
    n = 0
    for m in model.modules():
        if is_experts(m):
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
    return n


def active_parameters(model: nn.Module, parameters: int, facts: dict[str, Any]) -> int:
    """Parameters one token uses (see the module docstring); `parameters` for a dense model."""
    if not facts["num_experts"]:
        return parameters
    idle = 1 - facts["experts_per_token"] / facts["num_experts"]
    return parameters - round(routed_expert_parameters(model) * idle)


def experts_touched_expected(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Expected distinct experts a layer reads when `tokens` tokens each pick k of E uniformly:
    E x (1 - (1 - k/E)^tokens) (a token skips a given expert with probability 1 - k/E)."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens!r}")
    e, k = num_experts, experts_per_token
    return round(e * (1 - ((e - k) / e) ** tokens), 9)  # 9 decimals: 1 token gives k exactly
